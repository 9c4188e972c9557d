/*
 * client/cmd_sessions.c — `llamactl sessions`: list sessions.
 */
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/cli.h"
#include "util/grow.h"

/* The names llamad-http gives the sessions it makes (gateway/gw.h's
 * GW_SESSION_PREFIX; the client does not include the gateway's headers) */
#define GW_PREFIX "http-"

static int cmd_sessions(struct cli *cli, int argc, char **argv);

const struct command cmd_sessions_entry = {
	.name = "sessions",
	.args = "[--all]",
	.summary = "list sessions",
	.help =
"List the daemon's sessions: name, tokens, KV cache size, where the cache is\n"
"(pool: ready; ram: evicted to host memory; disk: in the state directory),\n"
"whether the state file is current, last use, busy; and OWNER first when the\n"
"list holds sessions of other users (root sees every user's).\n"
"The conversations llamad-http keeps for OpenAI and Ollama clients (sessions\n"
"named " GW_PREFIX "UID-...) are counted on a last line, not listed.\n"
"\n"
"  -a, --all    list llamad-http's sessions too\n"
"\n"
"With --json, an array of session objects (the fields of `show`), all of them.\n",
	.run = cmd_sessions,
};

static bool gateway_made(const Llamad__SessionInfo *s)
{
	return s->session && !strncmp(s->session, GW_PREFIX, strlen(GW_PREFIX));
}

static int cmd_sessions(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "all", no_argument, NULL, 'a' },
		{ 0 },
	};
	bool every = false;
	int o;
	while ((o = getopt_long(argc, argv, "hva", opts, NULL)) != -1) {
		if (o == 'a')
			every = true;
		else
			cli_opt(cli, NULL, o, optarg);
	}
	cli_want_args(cli, argc, argv, 0, 0);
	cli_connect(cli);
	/* the list comes in pages (each at most max_frame bytes): follow
	 * SessionList.next until it is absent */
	Llamad__Response **pages = NULL;
	const Llamad__SessionInfo **all = NULL;
	size_t n_pages = 0, n = 0, cap = 0;
	const char *after = NULL;
	do {
		Llamad__ListSessions ls = LLAMAD__LIST_SESSIONS__INIT;
		ls.after = (char *)after;
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_LIST;
		req.list = &ls;
		Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SESSIONS);
		Llamad__Response **np = realloc(pages, (n_pages + 1) * sizeof(*np));
		const Llamad__SessionList *l = r->sessions;
		size_t k = l ? l->n_sessions : 0;
		if (!np || grow((void **)&all, &cap, n + k + 1, sizeof(*all), 64))
			cli_die_local("out of memory");
		pages = np;
		pages[n_pages++] = r;
		for (size_t i = 0; i < k; i++)
			all[n++] = l->sessions[i];
		const char *next = l && l->next && *l->next ? l->next : NULL;
		if (next && after && strcmp(next, after) == 0)
			cli_die_local("the daemon's session list does not advance (cursor %s)", next);
		after = next;
	} while (after);
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		json_arr_begin(&j);
		for (size_t i = 0; i < n; i++)
			pbjson_object(&j, &all[i]->base);
		json_arr_end(&j);
		json_end(&j);
	} else {
		/* llamad-http's conversations apart, unless asked for */
		size_t kept = 0, hidden = 0;
		for (size_t i = 0; i < n; i++) {
			if (!every && gateway_made(all[i]))
				hidden++;
			else
				all[kept++] = all[i];
		}
		n = kept;
		int w = 7;
		bool others = false;   /* an OWNER column when not all are ours */
		for (size_t i = 0; i < n; i++) {
			const char *s = all[i]->session;
			int len = s ? (int)strlen(s) : 0;
			if (len > w)
				w = len;
			others |= all[i]->owner_uid != (uint32_t)geteuid();
		}
		if (others)
			printf("%-10s  ", "OWNER");
		printf("%-*s  %8s  %10s  %-5s  %-5s  %-9s  %s\n", w, "SESSION", "TOKENS", "KV",
		       "WHERE", "SAVED", "LAST USE", "BUSY");
		for (size_t i = 0; i < n; i++) {
			const Llamad__SessionInfo *s = all[i];
			char kv[32], age[32];
			cli_human_bytes(kv, sizeof(kv), s->kv_bytes);
			cli_human_age(age, sizeof(age), s->last_use_ms);
			if (others) {
				const struct passwd *pw = getpwuid(s->owner_uid);
				if (pw)
					printf("%-10s  ", pw->pw_name);
				else
					printf("%-10u  ", s->owner_uid);
			}
			printf("%-*s  %8u  %10s  %-5s  %-5s  %-9s  %s\n", w,
			       s->session ? s->session : "?", s->tokens, kv,
			       cli_location_name(s->location), s->saved ? "yes" : "no", age,
			       s->busy ? "yes" : "no");
		}
		if (hidden)
			printf("(and %zu conversation%s of llamad-http: --all lists %s)\n", hidden,
			       hidden == 1 ? "" : "s", hidden == 1 ? "it" : "them");
	}
	cli_flush_stdout();
	for (size_t i = 0; i < n_pages; i++)
		llamad__response__free_unpacked(pages[i], NULL);
	free(pages);
	free(all);
	return EXIT_OK;
}
