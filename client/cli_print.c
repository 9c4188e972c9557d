/*
 * client/cli_print.c — llamactl's printing: transcripts, the help and the command table, bytes
 * and ages for people, single JSON objects (cli.h).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client/cli.h"

Llamad__Response *cli_transcript(struct cli *cli, const char *session, uint32_t from,
				 uint32_t last, bool ids, const struct transcript_cb *cb)
{
	bool first = true;
	for (;;) {
		Llamad__GetTranscript g = LLAMAD__GET_TRANSCRIPT__INIT;
		g.session = (char *)session;
		PB_SET(&g, from_turn, from);
		if (first && last) {
			PB_SET(&g, last_turns, last);
		}
		if (ids) {
			PB_SET(&g, token_ids, 1);
		}
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_TRANSCRIPT;
		req.transcript = &g;
		Llamad__Response *r = cli_call_any(cli, &req);
		if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR)
			return r;
		const Llamad__Transcript *t = cli_expect(r, LLAMAD__RESPONSE__BODY_TRANSCRIPT)->transcript;
		if (first && cb->head)
			cb->head(cb->ctx, t);
		first = false;
		for (size_t i = 0; i < t->n_items && cb->turn; i++)
			cb->turn(cb->ctx, t->items[i]);
		/* the next page, unless this was the last (or made no progress) */
		bool more = t->next < t->turns && t->next > (t->has_first ? t->first : from) &&
			    t->n_items > 0;
		from = t->next;
		llamad__response__free_unpacked(r, NULL);
		if (!more)
			return NULL;
	}
}

void cli_print_dropped(FILE *f, const Llamad__Transcript *t)
{
	if (!t->dropped_turns)
		return;   /* an answer's slid tokens alone: its turn says so */
	fprintf(f, "[context shift: %u earlier turn%s dropped to make room; %llu token%s "
		"removed in all, answers' slid-out starts included]\n", t->dropped_turns,
		t->dropped_turns == 1 ? "" : "s", (unsigned long long)t->dropped_tokens,
		t->dropped_tokens == 1 ? "" : "s");
}

void cli_print_turn(FILE *f, const Llamad__Turn *u)
{
	fprintf(f, "[%u] %s (%u token%s", u->index, cli_role_name(u->role), u->tokens,
		u->tokens == 1 ? "" : "s");
	if (u->has_stop_reason)
		fprintf(f, ", ended: %s", cli_reason_name(u->stop_reason));
	if (u->truncated)
		fputs(", cut to fit one reply", f);
	if (u->has_slid_tokens && u->slid_tokens)
		fprintf(f, ", its first %u token%s slid out of the context", u->slid_tokens,
			u->slid_tokens == 1 ? "" : "s");
	fputs(")\n", f);
	const char *t = u->text ? u->text : "";
	size_t n = strlen(t);
	fputs(t, f);
	if (n && t[n - 1] != '\n')
		fputc('\n', f);
	if (u->n_token_ids) {
		fputs("ids:", f);
		for (size_t i = 0; i < u->n_token_ids; i++)
			fprintf(f, " %u", u->token_ids[i]);
		fputc('\n', f);
	}
	fputc('\n', f);
}

static const char global_help[] =
"Talk to llamad, the Llama model daemon, over its Unix socket.\n"
"\n"
"Options (also accepted after the command):\n"
"      --socket PATH   the daemon's socket (default: $LLAMAD_SOCKET, else\n"
"                      $XDG_RUNTIME_DIR/llamad/llamad.sock, or\n"
"                      /run/llamad/llamad.sock for root or without\n"
"                      XDG_RUNTIME_DIR)\n"
"      --json          machine-readable output: JSON objects, one a line, on\n"
"                      stdout (generate, chat and summarize: one per event as\n"
"                      it comes); errors too, as {\"event\":\"error\",...}\n"
"  -v, --verbose       counts, timings and progress on stderr\n"
"  -h, --help          this text; `llamactl COMMAND --help` for a command\n"
"      --version       print the version\n"
"\n"
"Exit status: 0 ok, 1 error from the daemon (or the connection broke),\n"
"2 usage error, 3 cannot connect to the daemon.\n";

void cli_print_help(const struct cli *cli, FILE *f)
{
	const struct command *c = cli ? cli->cmd : NULL;
	if (c) {
		fprintf(f, "usage: llamactl %s%s%s\n\n%s\n%s", c->name, *c->args ? " " : "",
			c->args, c->help, CLI_COMMON_HELP);
		return;
	}
	fprintf(f, "usage: llamactl [--socket PATH] [--json] [-v] COMMAND [ARGS...]\n\n"
		"Commands:\n");
	for (const struct command *const *k = cli ? cli->commands : NULL; k && *k; k++)
		fprintf(f, "  %-10s %s\n", (*k)->name, (*k)->summary);
	fprintf(f, "\n%s", global_help);
}

const struct command *cli_find_command(const struct cli *cli, const char *name)
{
	for (const struct command *const *c = cli->commands; *c; c++)
		if (strcmp((*c)->name, name) == 0)
			return *c;
	return NULL;
}

void cli_human_bytes(char *buf, size_t n, uint64_t v)
{
	static const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double x = (double)v;
	int u = 0;
	while (x >= 1024 && u < 4) {
		x /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%llu B", (unsigned long long)v);
	else
		snprintf(buf, n, "%.1f %s", x, unit[u]);
}

void cli_human_age(char *buf, size_t n, int64_t last_use_ms)
{
	if (last_use_ms <= 0) {
		snprintf(buf, n, "-");
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	int64_t s = (now - last_use_ms) / 1000;
	if (s < 0)
		s = 0;
	if (s < 60)
		snprintf(buf, n, "%llds ago", (long long)s);
	else if (s < 3600)
		snprintf(buf, n, "%lldm ago", (long long)(s / 60));
	else if (s < 86400)
		snprintf(buf, n, "%lldh ago", (long long)(s / 3600));
	else
		snprintf(buf, n, "%lldd ago", (long long)(s / 86400));
}

void cli_json_named(const char *key, const char *name)
{
	pbjson_line("{s:s}", key, name);
	cli_flush_stdout();
}

void cli_json_message(const ProtobufCMessage *m)
{
	struct json j;
	json_init(&j, stdout);
	pbjson_object(&j, m);
	json_end(&j);
}
