/*
 * daemon/config.c — see config.h. Every setting is one row of `keys`.
 */
#include <errno.h>
#include <pthread.h>
#include <limits.h>
#include <math.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "kernels/backend.h"
#include "proto/path.h"
#include "session/residency.h"
#include "session/session.h"
#include "text/chat.h"
#include "util/cause.h"
#include "util/mem.h"

enum ktype { K_STR, K_INT, K_U32, K_BYTES, K_MODE, K_FLOAT, K_ENUM, K_UIDS };

struct key {
	const char *name;
	enum ktype type;
	size_t off;
	double min, max;
	double def;          /* the default (K_STR: none, NULL) */
	int reload;          /* may change on SIGHUP */
	const char *help;
	const char *const *names;  /* K_ENUM: value names by value (gaps NULL) */
	int n_names;
	/* run by config_apply when the value changes (NULL: the readers look
	 * it up themselves) */
	void (*apply)(const struct config *c);
	int autov;           /* K_INT, K_BYTES: also takes "auto", stored as 0
			      * (the reader sizes it), outside [min, max] */
};

/* the template names are text/chat.h's (the wire's), filled in once */
static const char *tmpl_names[CHAT_TEMPLATE_MAX + 1];
static pthread_once_t tmpl_names_once = PTHREAD_ONCE_INIT;

static void fill_tmpl_names(void)
{
	for (int i = 0; i <= CHAT_TEMPLATE_MAX; i++)
		tmpl_names[i] = chat_template_name(i);
}
static const char *const policy_names[] = { [SESS_CTX_ERROR] = "error", [SESS_CTX_SHIFT] = "shift" };
static const char *const level_names[] = { [LL_ERROR] = "error", [LL_WARN] = "warning",
					   [LL_INFO] = "info", [LL_DEBUG] = "debug" };
static const char *const foreign_names[] = { "recompute", "refuse" };
static const char *const onoff_names[] = { "off", "on" };
static const char *const device_names[] = { [BACKEND_AUTO] = "auto", [BACKEND_CPU] = "cpu",
					    [BACKEND_CUDA] = "cuda" };
static const char *const kvtype_names[] = { [KT_F32] = "f32", [KT_F16] = "f16", [KT_Q8_0] = "q8_0" };
static const char *const wtype_names[] = { [BACKEND_W_F16] = "f16", [BACKEND_W_BF16] = "bf16",
					   [BACKEND_W_F32] = "f32" };

static void apply_log_level(const struct config *c)
{
	log_set_level(c->log_level);
}

/* Each row: name, type, field, min, max, default, reloadable, help; K_ENUM
 * rows add their value names (NAMES), rows with an apply hook add it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#define O(f) offsetof(struct config, f)
#define NAMES(a) a, (int)(sizeof(a) / sizeof(a[0]))
static const struct key keys[] = {
	{ "model", K_STR, O(model), 0, 0, 0, 0, "model file or Hugging Face folder" },
	{ "tokenizer", K_STR, O(tokenizer), 0, 0, 0, 0, "tokenizer.model, tokenizer.json, llama2.c tokenizer.bin or GGUF (default: the model's own, else beside it)" },
	{ "device", K_ENUM, O(device), 0, 0, BACKEND_AUTO, 0,
	  "backend: auto (the GPU when one is usable), cpu or cuda", NAMES(device_names) },
	{ "gpu_weights", K_ENUM, O(gpu_weights), 0, 0, BACKEND_W_F16, 0,
	  "dtype on the GPU of the model file's f32 matrices: f16, bf16 or f32", NAMES(wtype_names) },
	{ "gpu_kv_share", K_INT, O(gpu_kv_share), 1, 95, 0, 0,
	  "percent of the GPU memory free after the weights taken by the KV cache, or auto "
	  "(the default: 4 contexts, at least 256M, at most 1/4 of it)", NULL, 0, NULL, 1 },
	{ "threads", K_INT, O(threads), 0, 1024, 0, 0, "CPU worker threads (0: all cores)" },
	{ "socket", K_STR, O(socket), 0, 0, 0, 0, "listening socket path" },
	{ "socket_mode", K_MODE, O(socket_mode), 0, 0777, 0660, 0, "socket permissions, octal (0660)" },
	{ "socket_group", K_STR, O(socket_group), 0, 0, 0, 0, "group owning the socket" },
	{ "trusted_gateways", K_UIDS, O(trusted_gateways), 0, 0, 0, 1,
	  "users (names or uids, space or comma separated) whose connections may act for "
	  "other users (Hello.on_behalf_of_uid; root always may)" },
	{ "kv_memory", K_BYTES, O(kv_memory), 1 << 20, 1e15, 0, 0,
	  "KV cache: bytes (suffix K, M, G), N% of available memory, or auto (the default: "
	  "4 contexts, at least 256M, at most 1/4 of the available memory)", NULL, 0, NULL, 1 },
	{ "kv_type", K_ENUM, O(kv_type), 0, 0, KT_F16, 0,
	  "element type of the KV cache and of saved sessions: f16, q8_0 or f32", NAMES(kvtype_names) },
	{ "ram_cache", K_BYTES, O(ram_cache), 0, 1e15, 256 << 20, 0,
	  "host memory for K/V evicted from the cache (0: evict straight to disk)" },
	{ "state_dir", K_STR, O(state_dir), 0, 0, 0, 0,
	  "folder of saved sessions (\"none\": no persistence)" },
	{ "save_delay", K_INT, O(save_delay), 0, 86400, 5, 1, "seconds idle before a changed session is saved" },
	{ "foreign_cache", K_ENUM, O(foreign_cache), 0, 0, 0, 1,
	  "sessions saved under another model: recompute or refuse", NAMES(foreign_names) },
	{ "prefix_sharing", K_ENUM, O(prefix_sharing), 0, 0, 1, 1,
	  "sessions of one owner that begin alike share those blocks: on or off", NAMES(onoff_names) },
	{ "prefix_cache_time", K_INT, O(prefix_cache_time), 0, 1e7, 300, 1,
	  "seconds a free block keeps a prefix for later sessions once the daemon is idle; then "
	  "its memory goes back (0: at once)" },
	{ "max_sessions_per_uid", K_INT, O(max_sessions_per_uid), 0, 1e7, 256, 1, "sessions per user other than root (0: no quota)" },
	{ "max_kv_share_per_uid", K_INT, O(max_kv_share_per_uid), 1, 100, 50, 1, "percent of the KV cache one user other than root may hold (100: no limit)" },
	{ "disk_share_per_uid", K_INT, O(disk_share_per_uid), 1, 100, 10, 1, "percent of the state directory's file system one user other than root may fill with saved sessions (100: no limit)" },
	{ "max_sessions", K_INT, O(max_sessions), 1, 1e7, 1024, 1, "most sessions held at once" },
	{ "max_session_tokens", K_INT, O(max_session_tokens), 0, 1 << 24, 0, 1, "tokens per session (0: the model's context)" },
	{ "max_frame", K_U32, O(max_frame), 1024, 1 << 30, 16 << 20, 1, "largest request frame in bytes" },
	{ "max_text", K_U32, O(max_text), 1, 1 << 30, 1 << 20, 1, "largest text field in bytes" },
	{ "step_tokens", K_INT, O(step_tokens), 1, 65536, 512, 1, "tokens per forward step, all sessions together" },
	{ "fair_share", K_ENUM, O(fair_share), 0, 0, 1, 1,
	  "users with work share each step's rows equally, steps kept within twice the time of one "
	  "row's: on or off", NAMES(onoff_names) },
	{ "max_tokens", K_INT, O(max_tokens), 1, 1 << 20, 512, 1, "default reply length in tokens" },
	{ "template", K_ENUM, O(tmpl), 0, 0, CHAT_TEMPLATE_AUTO, 1,
	  "template of new sessions: auto (the model file's), llama3, llama2 or raw",
	  NAMES(tmpl_names) },
	{ "context_policy", K_ENUM, O(context_policy), 0, 0, SESS_CTX_ERROR, 1,
	  "when a session is full: error or shift", NAMES(policy_names) },
	{ "temperature", K_FLOAT, O(temperature), 0, 100, 0.8, 1, "default sampling temperature (0: greedy)" },
	{ "top_k", K_INT, O(top_k), 0, INT_MAX, 40, 1, "default top-k (0: off)" },
	{ "top_p", K_FLOAT, O(top_p), 1e-6, 1, 0.95, 1, "default top-p (1: off)" },
	{ "min_p", K_FLOAT, O(min_p), 0, 0.999, 0.05, 1, "default min-p (0: off)" },
	{ "repeat_penalty", K_FLOAT, O(repeat_penalty), 1e-3, 10, 1, 1, "default repetition penalty (1: off)" },
	{ "repeat_last_n", K_INT, O(repeat_last_n), -1, INT_MAX, 64, 1, "penalty window (-1: whole history)" },
	{ "presence_penalty", K_FLOAT, O(presence_penalty), -10, 10, 0, 1, "default presence penalty" },
	{ "frequency_penalty", K_FLOAT, O(frequency_penalty), -10, 10, 0, 1, "default frequency penalty" },
	{ "max_connections", K_INT, O(max_connections), 1, 1e6, 1024, 1, "most client connections at once (the last 1/16 kept for root, the daemon's user and trusted_gateways)" },
	{ "max_connections_per_uid", K_INT, O(max_connections_per_uid), 0, 1e6, 256, 1, "connections one user other than root, the daemon's user and trusted_gateways may hold (0: no limit)" },
	{ "idle_timeout", K_INT, O(idle_timeout), 0, 1e7, 300, 1, "close connections with no request in flight this many seconds (0: never)" },
	{ "frame_timeout", K_INT, O(frame_timeout), 1, 1e6, 30, 1, "seconds a frame may take to arrive, plus 1 per 256 KiB of it" },
	{ "log_level", K_ENUM, O(log_level), 0, 0, LL_INFO, 1, "error, warning, info or debug",
	  NAMES(level_names), apply_log_level },
};
#undef NAMES
#undef O
#pragma GCC diagnostic pop

#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

void config_defaults(struct config *c)
{
	pthread_once(&tmpl_names_once, fill_tmpl_names);
	memset(c, 0, sizeof(*c));  /* K_STR: NULL */
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];
		void *p = (char *)c + k->off;
		switch (k->type) {
		case K_STR: break;
		case K_INT: case K_ENUM: *(int *)p = (int)k->def; break;
		case K_U32: *(uint32_t *)p = (uint32_t)k->def; break;
		case K_BYTES: *(uint64_t *)p = (uint64_t)k->def; break;
		case K_MODE: *(unsigned *)p = (unsigned)k->def; break;
		case K_FLOAT: *(float *)p = (float)k->def; break;
		case K_UIDS: break;   /* empty */
		}
	}
}

void config_done(struct config *c)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (keys[i].type == K_STR) {
			char **p = (char **)((char *)c + keys[i].off);
			free(*p);
			*p = NULL;
		}
}

/* 1 if the setting of k differs between a and b. */
static int key_differs(const struct key *k, const struct config *a, const struct config *b)
{
	const void *pa = (const char *)a + k->off, *pb = (const char *)b + k->off;
	switch (k->type) {
	case K_STR: {
		const char *sa = *(char *const *)pa, *sb = *(char *const *)pb;
		return sa != sb && (!sa || !sb || strcmp(sa, sb));
	}
	case K_INT: case K_ENUM: return *(const int *)pa != *(const int *)pb;
	case K_U32: return *(const uint32_t *)pa != *(const uint32_t *)pb;
	case K_BYTES: return *(const uint64_t *)pa != *(const uint64_t *)pb;
	case K_MODE: return *(const unsigned *)pa != *(const unsigned *)pb;
	case K_FLOAT: return *(const float *)pa != *(const float *)pb;
	case K_UIDS: {
		const struct uid_list *la = pa, *lb = pb;
		return la->n != lb->n || memcmp(la->uid, lb->uid, (size_t)la->n * sizeof(la->uid[0]));
	}
	}
	return 1;
}

void config_apply(const struct config *old, const struct config *c)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (keys[i].apply && (!old || key_differs(&keys[i], old, c)))
			keys[i].apply(c);
}

static const struct key *find_key(const char *name)
{
	pthread_once(&tmpl_names_once, fill_tmpl_names);
	char norm[64];
	size_t n = strlen(name);
	if (n >= sizeof(norm))
		return NULL;
	for (size_t i = 0; i <= n; i++)
		norm[i] = name[i] == '-' ? '_' : name[i];
	for (size_t i = 0; i < N_KEYS; i++)
		if (!strcmp(keys[i].name, norm))
			return &keys[i];
	return NULL;
}

static int parse_enum(const char *v, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (names[i] && !strcmp(names[i], v))
			return i;
	return -1;
}

int config_uid_listed(const struct uid_list *l, uint32_t uid)
{
	for (int i = 0; i < l->n; i++)
		if (l->uid[i] == uid)
			return 1;
	return 0;
}

/* A list of users, names or numeric uids, separated by spaces or commas,
 * into *l (left as it was on an error: -EINVAL with *why, static). A name
 * is looked up now: one that does not exist is an error. */
static int parse_uids(const char *v, struct uid_list *l, const char **why)
{
	static char msg[160];
	struct uid_list out = { 0 };
	const char *sep = " \t,";
	for (const char *p = v + strspn(v, sep); *p; p += strspn(p, sep)) {
		size_t n = strcspn(p, sep);
		char name[256];
		if (n >= sizeof(name)) {
			*why = "a user name of more than 255 bytes";
			return -EINVAL;
		}
		memcpy(name, p, n);
		name[n] = 0;
		p += n;
		uint32_t uid;
		char *end;
		errno = 0;
		unsigned long long x = strtoull(name, &end, 10);
		if (name[0] >= '0' && name[0] <= '9' && !*end) {
			if (errno || x >= UINT32_MAX) {
				snprintf(msg, sizeof(msg), "uid %.32s is out of range", name);
				*why = msg;
				return -EINVAL;
			}
			uid = (uint32_t)x;
		} else {
			struct passwd pw, *r = NULL;
			long cap = sysconf(_SC_GETPW_R_SIZE_MAX);
			char buf[cap > 0 && cap <= 65536 ? cap : 16384];
			int e = getpwnam_r(name, &pw, buf, sizeof(buf), &r);
			if (e || !r) {
				snprintf(msg, sizeof(msg), "no user named '%.64s'%s%s", name,
					 e ? ": " : "", e ? strerror(e) : "");
				*why = msg;
				return -EINVAL;
			}
			uid = (uint32_t)r->pw_uid;
		}
		if (config_uid_listed(&out, uid))
			continue;
		if (out.n == CONFIG_MAX_UIDS) {
			snprintf(msg, sizeof(msg), "more than %d users", CONFIG_MAX_UIDS);
			*why = msg;
			return -EINVAL;
		}
		out.uid[out.n++] = uid;
	}
	*l = out;
	return 0;
}

static int parse_bytes(const char *v, uint64_t *out)
{
	size_t vl = strlen(v);
	if (vl > 1 && v[vl - 1] == '%') {  /* a share of the available memory */
		char *end;
		errno = 0;
		double pct = strtod(v, &end);
		if (errno || end != v + vl - 1 || !(pct > 0 && pct <= 100))
			return -1;
		*out = (uint64_t)(mem_available(NULL) * (pct / 100));
		return 0;
	}
	char *end;
	errno = 0;
	double d = strtod(v, &end);
	if (errno || end == v || !(d >= 0))
		return -1;
	double mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	}
	if (*end == 'i' && end[-1] != *v)
		end++;  /* KiB, MiB, ... */
	if (*end == 'B')
		end++;
	if (*end)
		return -1;
	*out = (uint64_t)(d * mul);
	return 0;
}

/* n bytes for people: "1M", "1.5G", "512K", "100" (powers of 1024). */
static void human_size(char *buf, size_t cap, double n)
{
	static const char units[] = "KMGTP";
	int u = -1;
	while (n >= 1024 && u < 4) {
		n /= 1024;
		u++;
	}
	if (u < 0)
		snprintf(buf, cap, "%.0f", n);
	else
		snprintf(buf, cap, n == (double)(long long)n ? "%.0f%c" : "%.1f%c", n, units[u]);
}

int config_set(struct config *c, const char *key, const char *v, int reload_only,
	       const char **why)
{
	/* messages that name the key's range (static: the caller copies it
	 * before the next parse, as for K_ENUM) */
	static char msg[160];
	const struct key *k = find_key(key);
	if (!k)
		return -ENOENT;
	if (reload_only && !k->reload)
		return 1;
	void *p = (char *)c + k->off;
	char *end;
	if (k->autov && !strcmp(v, "auto")) {
		if (k->type == K_BYTES)
			*(uint64_t *)p = 0;
		else
			*(int *)p = 0;
		return 0;
	}
	switch (k->type) {
	case K_UIDS:
		return parse_uids(v, p, why);   /* empty: none */
	case K_STR: {
		if (!*v) {
			*why = "empty value";
			return -EINVAL;
		}
		char *d = strdup(v);
		if (!d) {
			*why = "out of memory";
			return -ENOMEM;
		}
		free(*(char **)p);
		*(char **)p = d;
		return 0;
	}
	case K_INT:
	case K_U32: {
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (errno || end == v || *end || x < k->min || x > k->max) {
			snprintf(msg, sizeof(msg), "expected an integer from %.0f to %.0f%s",
				 (double)k->min, (double)k->max, k->autov ? ", or auto" : "");
			*why = msg;
			return -EINVAL;
		}
		if (k->type == K_U32)
			*(uint32_t *)p = (uint32_t)x;
		else
			*(int *)p = (int)x;
		return 0;
	}
	case K_BYTES: {
		uint64_t x;
		char lo[32], hi[32];
		human_size(lo, sizeof(lo), (double)k->min);
		human_size(hi, sizeof(hi), (double)k->max);
		if (parse_bytes(v, &x)) {
			snprintf(msg, sizeof(msg), "expected a size such as 512M, 4G or 25%% "
				 "(of the available memory), from %s to %s%s", lo, hi,
				 k->autov ? ", or auto" : "");
			*why = msg;
			return -EINVAL;
		}
		if (x < k->min || x > k->max) {
			snprintf(msg, sizeof(msg), "too %s: the %s is %s",
				 x < k->min ? "small" : "large", x < k->min ? "minimum" : "maximum",
				 x < k->min ? lo : hi);
			*why = msg;
			return -EINVAL;
		}
		*(uint64_t *)p = x;
		return 0;
	}
	case K_MODE: {
		errno = 0;
		unsigned long x = strtoul(v, &end, 8);
		if (errno || end == v || *end || x > 0777) {
			*why = "expected an octal mode such as 0660";
			return -EINVAL;
		}
		*(unsigned *)p = (unsigned)x;
		return 0;
	}
	case K_FLOAT: {
		errno = 0;
		double x = strtod(v, &end);
		if (errno || end == v || *end || !isfinite(x) || x < k->min || x > k->max) {
			snprintf(msg, sizeof(msg), "expected a number from %g to %g", (double)k->min,
				 (double)k->max);
			*why = msg;
			return -EINVAL;
		}
		*(float *)p = (float)x;
		return 0;
	}
	case K_ENUM: {
		int x = parse_enum(v, k->names, k->n_names);
		if (x < 0) {
			/* "expected a, b or c" from the names (static: the caller
			 * copies it before the next parse) */
			static char msg[128];
			size_t n = (size_t)snprintf(msg, sizeof(msg), "expected");
			int left = 0;
			for (int i = 0; i < k->n_names; i++)
				left += k->names[i] != NULL;
			for (int i = 0; i < k->n_names && n < sizeof(msg); i++) {
				if (!k->names[i])
					continue;
				left--;
				n += (size_t)snprintf(msg + n, sizeof(msg) - n, "%s%s",
						      n > 8 ? (left ? ", " : " or ") : " ", k->names[i]);
			}
			*why = msg;
			return -EINVAL;
		}
		*(int *)p = x;
		return 0;
	}
	}
	return -EINVAL;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = 0;
	return s;
}

int config_load(struct config *c, const char *path, int reload_only, char **cause)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		int e = errno;
		cause_set(cause, "%s: %s", path, strerror(e));
		return -e;
	}
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0, rc = 0;
	while (getline(&line, &cap, f) > 0) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		char *s = trim(line);
		if (!*s)
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			cause_set(cause, "%s:%d: expected key = value", path, lineno);
			rc = -EINVAL;
			break;
		}
		*eq = 0;
		char *k = trim(s), *v = trim(eq + 1);
		size_t vl = strlen(v);
		if (vl >= 2 && v[0] == '"' && v[vl - 1] == '"') {
			v[vl - 1] = 0;
			v++;
		}
		const char *why = NULL;
		int r = config_set(c, k, v, reload_only, &why);
		if (r == -ENOENT) {
			cause_set(cause, "%s:%d: unknown key '%s'", path, lineno, k);
			rc = -EINVAL;
			break;
		}
		if (r < 0) {
			cause_set(cause, "%s:%d: %s = %s: %s", path, lineno, k, v, why);
			rc = -EINVAL;
			break;
		}
	}
	free(line);
	fclose(f);
	return rc;
}

void config_dump(const struct config *c, FILE *f)
{
	pthread_once(&tmpl_names_once, fill_tmpl_names);
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];
		const void *p = (const char *)c + k->off;
		if (k->type == K_STR && !*(char *const *)p) {
			/* unset; the folders and paths it then takes, as here */
			char *d = !strcmp(k->name, "socket") ? path_default_socket()
				: !strcmp(k->name, "state_dir") ? res_dir_of(NULL) : NULL;
			if (d)
				fprintf(f, "# %s =     (unset: %s here)\n", k->name, d);
			else
				fprintf(f, "# %s =\n", k->name);
			free(d);
			continue;
		}
		if (k->type == K_UIDS && !((const struct uid_list *)p)->n) {
			fprintf(f, "%s =\n", k->name);   /* none */
			continue;
		}
		fprintf(f, "%s = ", k->name);
		if (k->autov && ((k->type == K_BYTES && !*(const uint64_t *)p) ||
				 (k->type == K_INT && !*(const int *)p))) {
			fprintf(f, "auto\n");
			continue;
		}
		switch (k->type) {
		case K_STR: fprintf(f, "%s", *(char *const *)p); break;
		case K_INT: fprintf(f, "%d", *(const int *)p); break;
		case K_U32: fprintf(f, "%u", *(const uint32_t *)p); break;
		case K_BYTES: fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)p); break;
		case K_MODE: fprintf(f, "0%o", *(const unsigned *)p); break;
		case K_FLOAT: fprintf(f, "%g", (double)*(const float *)p); break;
		case K_ENUM: fprintf(f, "%s", k->names[*(const int *)p]); break;
		case K_UIDS: {
			const struct uid_list *l = p;
			for (int u = 0; u < l->n; u++)
				fprintf(f, "%s%u", u ? " " : "", (unsigned)l->uid[u]);
			break;
		}
		}
		fputc('\n', f);
	}
}

void config_help(FILE *f)
{
	for (size_t i = 0; i < N_KEYS; i++) {
		char flag[64];
		snprintf(flag, sizeof(flag), "--%s", keys[i].name);
		for (char *p = flag; *p; p++)
			if (*p == '_')
				*p = '-';
		fprintf(f, "  %-24s %s%s\n", flag, keys[i].help, keys[i].reload ? "" : " [restart]");
	}
}
