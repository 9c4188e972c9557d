/*
 * daemon/config.h — llamad's settings: one table of keys (name, type,
 * bounds, default, reloadable, apply hook), read from a file (`key = value`
 * lines, `#` comments) and overridden by command-line flags `--key VALUE`
 * (dashes or underscores). Documented in llamad.conf(5).
 */
#ifndef LLAMAD_DAEMON_CONFIG_H
#define LLAMAD_DAEMON_CONFIG_H

#include <stdint.h>
#include <stdio.h>

/* A list of uids, held in the config itself: a config is copied whole (the
 * engine's copy, SIGHUP's), so the list needs no owner. */
#define CONFIG_MAX_UIDS 32
struct uid_list {
	int n;
	uint32_t uid[CONFIG_MAX_UIDS];
};

struct config {
	char *model;
	char *tokenizer;
	int threads;             /* 0: all cores */
	char *socket;            /* NULL: $LLAMAD_SOCKET or the default */
	unsigned socket_mode;
	char *socket_group;
	uint64_t kv_memory;      /* bytes of the KV block pool (0: auto, session/kvsize.h) */
	int kv_type;             /* enum kt_dtype: KT_F32, KT_F16 or KT_Q8_0 */
	int max_sessions;
	int max_session_tokens;  /* 0: the model's context */
	uint32_t max_frame;
	uint32_t max_text;
	int step_tokens;         /* tokens per forward step (all sessions) */
	int fair_share;          /* 1: users share a step's rows (daemon/fair.h) */
	int max_tokens;          /* default reply length */
	int tmpl;                /* enum chat_template (CHAT_TEMPLATE_AUTO: the model file's) */
	int context_policy;      /* enum sess_policy */
	float temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
	int top_k, repeat_last_n;
	int max_connections;
	int max_connections_per_uid;  /* 0: no limit; root, our user, gateways: none */
	int idle_timeout;        /* seconds; 0: none */
	int max_kv_share_per_uid;  /* percent of the KV pool one uid's sessions may hold (root: any) */
	int disk_share_per_uid;  /* percent of the state dir's file system; 100: all */
	int frame_timeout;       /* seconds an unfinished frame may take (+1 per 256 KiB) */
	int log_level;           /* 0 error, 1 warning, 2 info, 3 debug */
	char *state_dir;         /* NULL: the default; "none": no persistence */
	int save_delay;          /* seconds idle before a changed session is saved */
	int foreign_cache;       /* 0: recompute from the tokens, 1: refuse */
	int prefix_sharing;      /* 1: sessions of one owner share common prefixes */
	int prefix_cache_time;   /* seconds free named blocks stay, when idle */
	uint64_t ram_cache;      /* bytes of host memory for evicted K/V */
	int max_sessions_per_uid;/* 0: no quota */
	int device;              /* enum backend_kind */
	int gpu_weights;         /* enum backend_wtype */
	int gpu_kv_share;        /* percent of free GPU memory for the KV pool (0: auto) */
	struct uid_list trusted_gateways;  /* peers that may act for other uids */
};

/* Fill c with the defaults (every row of the key table carries its own;
 * strings NULL). */
void config_defaults(struct config *c);
/* Free owned strings. */
void config_done(struct config *c);
/* Set key (dashes or underscores) from text. Returns 0; -ENOENT for an
 * unknown key; -EINVAL with *why (static text) for a bad value. With
 * reload_only set, keys that cannot change at run time are skipped (1). */
int config_set(struct config *c, const char *key, const char *value, int reload_only,
	       const char **why);
/* Read a file. Returns 0, or -errno with *cause (malloc'd) "FILE:LINE: ...". */
int config_load(struct config *c, const char *path, int reload_only, char **cause);
/* Make the settings of c take effect where a key has an apply hook (the
 * log level): for each key whose value differs from old, or every such
 * key when old is NULL (at start-up). Neither is modified or kept. */
void config_apply(const struct config *old, const struct config *c);
/* 1 if uid is in the list l. */
int config_uid_listed(const struct uid_list *l, uint32_t uid);
/* Print every key with its current value, as a config file. */
void config_dump(const struct config *c, FILE *f);
/* Print the keys with one line of help each (for --help). */
void config_help(FILE *f);

#endif
