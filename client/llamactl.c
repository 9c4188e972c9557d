/*
 * client/llamactl.c — llamactl, the shell client of llamad: global options,
 * the command table, and the commands that are one request each (generate,
 * sessions, show, fork, drop, tokenize, status). chat.c and summarize.c hold
 * the two bigger ones; conn.c speaks the protocol.
 */
#include <errno.h>
#include <getopt.h>
#include <locale.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"

static const struct command commands[];

/* ---- help ------------------------------------------------------------------ */

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

static const char generate_help[] =
"Append PROMPT (or stdin with \"-\") to the session as a user turn and stream\n"
"the model's answer to stdout. Without PROMPT, continue the session from where\n"
"it stands. Without --session, use a throw-away session.\n"
"\n"
"  -s, --session NAME      the session (created if missing)\n"
"      --raw               PROMPT is raw text, not a user turn; a session this\n"
"                          creates uses the raw template (no chat format)\n"
"      --context-policy P  when the session is full: error (the default of the\n"
"                          daemon's, usually) or shift (drop the oldest turns);\n"
"                          applies to an existing session too\n"
"\n"
CLI_SAMPLER_HELP
"\n"
"With --json, JSON lines on stdout, one object a line, flushed as they come:\n"
"{\"event\":\"token\",\"text\":..,\"tokens\":[..]} per token event, then\n"
"{\"event\":\"done\",\"session\":..,\"text\":(all of it),\"reason\":.., counts}, or\n"
"{\"event\":\"error\",\"error\":..,\"code\":..,\"message\":..} (the exit status is\n"
"the same as without --json).\n";

static const char sessions_help[] =
"List the daemon's sessions: name, tokens, KV cache size, where the cache is\n"
"(pool: ready; ram: evicted to host memory; disk: in the state directory),\n"
"whether the state file is current, last use, busy.\n"
"With --json, an array of session objects (the fields of `show`).\n";

static const char show_help[] =
"Print what the daemon knows of session NAME: turns, tokens, KV cache,\n"
"template, system prompt, last use. With --transcript, print its turns instead:\n"
"each turn's index, role, token count and, for answers the model generated,\n"
"why it ended (eos, max_tokens, stop, context_full, cancelled), then its text\n"
"(a client's turn: the text sent; an answer: its tokens detokenized). A\n"
"session on disk is read from its state file, not restored.\n"
"\n"
"      --transcript        print the turns\n"
"      --last N            only the last N turns (implies --transcript)\n"
"      --from K            from turn K on (0 is the first; implies --transcript)\n"
"      --ids               also each turn's token ids (implies --transcript)\n"
"\n"
"With --json, one object: the session's fields or, with --transcript, the\n"
"transcript: session, turns, first, next, template, location, system, busy and\n"
"items, an array of {index, role, text, tokens, start, generated, stop_reason,\n"
"truncated[, token_ids]}.\n";

static const char fork_help[] =
"Fork session SRC into a new session DST sharing its history (and its KV\n"
"cache, copy-on-write). Prints nothing, or DST's info with --json.\n";

static const char drop_help[] =
"Drop session NAME and free its KV cache.\n";

static const char tokenize_help[] =
"Tokenize TEXT (or stdin, with \"-\" or no TEXT) with the daemon's tokenizer;\n"
"print one token a line: id and piece. With --json: {\"tokens\":[..],\"pieces\":[..]}.\n"
"\n"
"      --bos               add the beginning-of-sequence token\n";

static const char status_help[] =
"Print the daemon's status: model, backend, uptime, sessions, KV cache,\n"
"counters.\n";

static const char help_help[] =
"Print the help of COMMAND, or the global help.\n";

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
	for (const struct command *k = commands; k->name; k++)
		fprintf(f, "  %-10s %s\n", k->name, k->summary);
	fprintf(f, "\n%s", global_help);
}

/* ---- small helpers -------------------------------------------------------- */

static void human_bytes(char *buf, size_t n, uint64_t v)
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

static void human_age(char *buf, size_t n, int64_t last_use_ms)
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

static void human_time(char *buf, size_t n, int64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	if (ms <= 0 || !localtime_r(&t, &tm) || !strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm))
		snprintf(buf, n, "-");
}

/* Check the count of positional arguments after the options: exits 2
 * unless there are min..max of them. */
static void want_args_at(const struct cli *cli, int argc, char **argv, int min, int max)
{
	int n = argc - optind;
	if (n > max)
		cli_usage_error(cli, "unexpected argument '%s'%s", argv[optind + max],
				max == 1 ? " (quote text that has spaces)" : "");
	if (n < min)
		cli_usage_error(cli, "missing argument");
}

/* Parse options of a command that takes only the common ones. */
static void parse_common(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = { CLI_COMMON_OPTS, { 0 } };
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1)
		cli_opt(cli, NULL, o, optarg);
}

/* Text from a positional argument, or stdin for "-" or NULL. The result is
 * malloc'd. */
static char *text_arg(const char *arg)
{
	if (arg && strcmp(arg, "-") != 0) {
		char *s = strdup(arg);
		if (!s)
			cli_die_local("out of memory");
		return s;
	}
	size_t n;
	return cli_read_all(STDIN_FILENO, &n);
}

/* ---- generate -------------------------------------------------------------- */

static int cmd_generate(struct cli *cli, int argc, char **argv)
{
	enum { O_SESSION = OPT_CMD, O_RAW, O_POLICY };
	static const struct option opts[] = {
		CLI_COMMON_OPTS, CLI_SAMPLER_OPTS,
		{ "session", required_argument, NULL, 's' },
		{ "raw", no_argument, NULL, O_RAW },
		{ "context-policy", required_argument, NULL, O_POLICY },
		{ 0 },
	};
	Llamad__ContextPolicy policy = LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT;
	struct gen_opts g;
	gen_opts_init(&g);
	const char *session = NULL;
	bool raw = false;
	int o;
	while ((o = getopt_long(argc, argv, "hvn:s:", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			session = optarg;
			break;
		case O_RAW:
			raw = true;
			break;
		case O_POLICY:
			policy = cli_parse_policy(cli, optarg);
			break;
		default:
			cli_opt(cli, &g, o, optarg);
		}
	}
	want_args_at(cli, argc, argv, 0, 1);
	cli_connect(cli);
	char *prompt = optind < argc ? text_arg(argv[optind]) : NULL;

	char eph[64];
	Llamad__Template tmpl = raw ? LLAMAD__TEMPLATE__TEMPLATE_RAW
				    : LLAMAD__TEMPLATE__TEMPLATE_DEFAULT;
	struct open_opts oo = { .tmpl = tmpl, .policy = policy };
	if (!session) {
		cli_ephemeral_name(eph, sizeof(eph));
		session = eph;
		oo.ephemeral = oo.create_only = true;
	}
	llamad__response__free_unpacked(cli_open_session(cli, session, &oo, false), NULL);

	struct gen_req req = {
		.session = session,
		.prompt = prompt,
		.role = raw ? LLAMAD__ROLE__ROLE_RAW : LLAMAD__ROLE__ROLE_USER,
		.opts = &g,
		.echo = cli->json ? NULL : stdout,
		.events = cli->json,
		.collect = cli->json,
	};
	struct gen_result res;
	cli_generate(cli, &req, &res);
	free(prompt);
	Llamad__Response *t = res.term;
	if (t->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		if (!cli->json && res.len == 0)
			cli_flush_stdout();
		cli_print_error(t);
		gen_result_done(&res);
		return EXIT_DAEMON;
	}
	cli_expect(t, LLAMAD__RESPONSE__BODY_DONE);
	return cli_gen_finish(cli, session == eph ? NULL : session, &res);
}

/* ---- sessions, show, fork, drop -------------------------------------------- */

static int cmd_sessions(struct cli *cli, int argc, char **argv)
{
	parse_common(cli, argc, argv);
	want_args_at(cli, argc, argv, 0, 0);
	cli_connect(cli);
	Llamad__ListSessions ls = LLAMAD__LIST_SESSIONS__INIT;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_LIST;
	req.list = &ls;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SESSIONS);
	const Llamad__SessionList *l = r->sessions;
	size_t n = l ? l->n_sessions : 0;
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		json_arr_begin(&j);
		for (size_t i = 0; i < n; i++)
			cli_json_session(&j, l->sessions[i]);
		json_arr_end(&j);
		json_end(&j);
	} else {
		int w = 7;
		for (size_t i = 0; i < n; i++) {
			const char *s = l->sessions[i]->session;
			int len = s ? (int)strlen(s) : 0;
			if (len > w)
				w = len;
		}
		printf("%-*s  %8s  %10s  %-5s  %-5s  %-9s  %s\n", w, "SESSION", "TOKENS", "KV",
		       "WHERE", "SAVED", "LAST USE", "BUSY");
		for (size_t i = 0; i < n; i++) {
			const Llamad__SessionInfo *s = l->sessions[i];
			char kv[32], age[32];
			human_bytes(kv, sizeof(kv), s->kv_bytes);
			human_age(age, sizeof(age), s->last_use_ms);
			printf("%-*s  %8u  %10s  %-5s  %-5s  %-9s  %s\n", w,
			       s->session ? s->session : "?", s->tokens, kv,
			       cli_location_name(s->location), s->saved ? "yes" : "no", age,
			       s->busy ? "yes" : "no");
		}
	}
	cli_flush_stdout();
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}

static Llamad__Response *get_info(struct cli *cli, const char *session)
{
	Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
	gi.session = (char *)session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_INFO;
	req.info = &gi;
	return cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SESSION);
}

static void print_session(const Llamad__SessionInfo *s)
{
	char kv[32], age[32], when[64];
	human_bytes(kv, sizeof(kv), s->kv_bytes);
	human_age(age, sizeof(age), s->last_use_ms);
	human_time(when, sizeof(when), s->last_use_ms);
	printf("session:          %s\n", s->session ? s->session : "?");
	printf("turns:            %u\n", s->turns);
	printf("tokens:           %u (%u with K/V cached)\n", s->tokens, s->cached_tokens);
	printf("kv cache:         %s in %u blocks (%u shared)\n", kv, s->kv_blocks,
	       s->shared_blocks);
	printf("context length:   %u\n", s->context_length);
	printf("template:         %s\n", cli_template_name(s->template_));
	printf("context policy:   %s\n", cli_policy_name(s->context_policy));
	if (s->system && *s->system) {
		fputs("system:           ", stdout);
		for (const char *p = s->system; *p; p++)   /* keep it one line */
			fputs(*p == '\n' ? "\\n" : (char[2]){ *p, 0 }, stdout);
		fputc('\n', stdout);
	}
	printf("last use:         %s (%s)\n", when, age);
	printf("location:         %s\n", cli_location_name(s->location));
	if (s->file_bytes) {
		char fb[32];
		human_bytes(fb, sizeof(fb), s->file_bytes);
		printf("state file:       %s (%s)\n", fb, s->saved ? "current" : "older");
	} else {
		printf("state file:       none\n");
	}
	printf("busy:             %s\n", s->busy ? "yes" : "no");
	printf("ephemeral:        %s\n", s->ephemeral ? "yes" : "no");
	if (s->has_owner_uid)
		printf("owner uid:        %u\n", s->owner_uid);
	printf("prefilled tokens: %llu\n", (unsigned long long)s->prefilled_tokens);
	printf("generated tokens: %llu\n", (unsigned long long)s->generated_tokens);
}

/* show --transcript: the page header and the turns, for people or JSON */
struct show_tx {
	struct json j;
	bool json;
};

static void show_head(void *ctx, const Llamad__Transcript *t)
{
	struct show_tx *x = ctx;
	if (!x->json) {
		printf("session %s: %u turn%s, template %s%s\n", t->session ? t->session : "?",
		       t->turns, t->turns == 1 ? "" : "s", cli_template_name(t->template_),
		       t->location == LLAMAD__LOCATION__LOCATION_DISK ? ", on disk" : "");
		if (t->system && *t->system)
			printf("system prompt: %s\n", t->system);
		if (t->first > 0)
			printf("(%u earlier turn%s not shown)\n", t->first, t->first == 1 ? "" : "s");
		putchar('\n');
		return;
	}
	struct json *j = &x->j;
	json_obj_begin(j);
	json_key(j, "session");
	json_str(j, t->session);
	json_key(j, "turns");
	json_u64(j, t->turns);
	json_key(j, "first");
	json_u64(j, t->first);
	json_key(j, "template");
	json_str(j, cli_template_name(t->template_));
	json_key(j, "location");
	json_str(j, cli_location_name(t->location));
	json_key(j, "system");
	json_str(j, t->system);
	json_key(j, "busy");
	json_bool(j, t->busy);
	json_key(j, "items");
	json_arr_begin(j);
}

static void show_turn(void *ctx, const Llamad__Turn *u)
{
	struct show_tx *x = ctx;
	if (x->json)
		cli_json_turn(&x->j, u);
	else
		cli_print_turn(stdout, u);
}

static int show_transcript(struct cli *cli, const char *session, uint32_t from, uint32_t last,
			   bool ids)
{
	struct show_tx x = { .json = cli->json };
	json_init(&x.j, stdout);
	struct transcript_cb cb = { show_head, show_turn, &x };
	Llamad__Response *e = cli_transcript(cli, session, from, last, ids, &cb);
	if (e) {
		cli_flush_stdout();
		cli_print_error(e);
		llamad__response__free_unpacked(e, NULL);
		return EXIT_DAEMON;
	}
	if (cli->json) {
		json_arr_end(&x.j);
		json_obj_end(&x.j);
		json_end(&x.j);
	}
	cli_flush_stdout();
	return EXIT_OK;
}

static int cmd_show(struct cli *cli, int argc, char **argv)
{
	enum { O_TRANSCRIPT = OPT_CMD, O_LAST, O_FROM, O_IDS };
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "transcript", no_argument, NULL, O_TRANSCRIPT },
		{ "last", required_argument, NULL, O_LAST },
		{ "from", required_argument, NULL, O_FROM },
		{ "ids", no_argument, NULL, O_IDS },
		{ 0 },
	};
	bool transcript = false, ids = false;
	uint32_t last = 0, from = 0;
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1) {
		switch (o) {
		case O_TRANSCRIPT:
			transcript = true;
			break;
		case O_LAST:
			last = (uint32_t)cli_parse_u64(cli, "--last", optarg, 1, UINT32_MAX);
			transcript = true;
			break;
		case O_FROM:
			from = (uint32_t)cli_parse_u64(cli, "--from", optarg, 0, UINT32_MAX);
			transcript = true;
			break;
		case O_IDS:
			ids = transcript = true;
			break;
		default:
			cli_opt(cli, NULL, o, optarg);
		}
	}
	want_args_at(cli, argc, argv, 1, 1);
	cli_connect(cli);
	if (transcript)
		return show_transcript(cli, argv[optind], from, last, ids);
	Llamad__Response *r = get_info(cli, argv[optind]);
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		cli_json_session(&j, r->session);
		json_end(&j);
	} else {
		print_session(r->session);
	}
	cli_flush_stdout();
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}

static int cmd_fork(struct cli *cli, int argc, char **argv)
{
	parse_common(cli, argc, argv);
	want_args_at(cli, argc, argv, 2, 2);
	cli_connect(cli);
	Llamad__Fork f = LLAMAD__FORK__INIT;
	f.session = argv[optind];
	f.target = argv[optind + 1];
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_FORK;
	req.fork = &f;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SESSION);
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		cli_json_session(&j, r->session);
		json_end(&j);
		cli_flush_stdout();
	} else if (cli->verbose) {
		fprintf(stderr, "llamactl: forked %s to %s (%u tokens)\n", f.session,
			f.target, r->session->tokens);
	}
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}

static int cmd_drop(struct cli *cli, int argc, char **argv)
{
	parse_common(cli, argc, argv);
	want_args_at(cli, argc, argv, 1, 1);
	cli_connect(cli);
	cli_drop_session(cli, argv[optind], false);
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		json_obj_begin(&j);
		json_key(&j, "dropped");
		json_str(&j, argv[optind]);
		json_obj_end(&j);
		json_end(&j);
		cli_flush_stdout();
	}
	return EXIT_OK;
}

static const char save_help[] =
"Write session NAME (or, with --all, every session you own; root: all) to\n"
"the daemon's state directory now, instead of waiting for it to go idle.\n"
"\n"
"      --all               every session\n";

static int cmd_save(struct cli *cli, int argc, char **argv)
{
	enum { O_ALL = OPT_CMD };
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "all", no_argument, NULL, O_ALL },
		{ 0 },
	};
	bool all = false;
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1) {
		if (o == O_ALL)
			all = true;
		else
			cli_opt(cli, NULL, o, optarg);
	}
	want_args_at(cli, argc, argv, all ? 0 : 1, all ? 0 : 1);
	cli_connect(cli);
	Llamad__Save sv = LLAMAD__SAVE__INIT;
	if (all)
		PB_SET(&sv, all, 1);
	else
		sv.session = argv[optind];
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_SAVE;
	req.save = &sv;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SAVED);
	char b[32];
	human_bytes(b, sizeof(b), r->saved->bytes);
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		json_obj_begin(&j);
		json_key(&j, "sessions");
		json_u64(&j, r->saved->sessions);
		json_key(&j, "bytes");
		json_u64(&j, r->saved->bytes);
		json_obj_end(&j);
		json_end(&j);
		cli_flush_stdout();
	} else if (cli->verbose || all) {
		fprintf(stderr, "llamactl: saved %u session%s (%s)\n", r->saved->sessions,
			r->saved->sessions == 1 ? "" : "s", b);
	}
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}

/* ---- tokenize, status -------------------------------------------------------- */

/* A token piece on one line: control bytes escaped, the rest as is. */
static void print_piece(const char *p)
{
	for (; p && *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '\n')
			fputs("\\n", stdout);
		else if (c == '\t')
			fputs("\\t", stdout);
		else if (c == '\r')
			fputs("\\r", stdout);
		else if (c == '\\')
			fputs("\\\\", stdout);
		else if (c < 0x20 || c == 0x7f)
			printf("\\x%02x", c);
		else
			fputc(c, stdout);
	}
}

static int cmd_tokenize(struct cli *cli, int argc, char **argv)
{
	enum { O_BOS = OPT_CMD };
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "bos", no_argument, NULL, O_BOS },
		{ 0 },
	};
	bool bos = false;
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1) {
		if (o == O_BOS)
			bos = true;
		else
			cli_opt(cli, NULL, o, optarg);
	}
	want_args_at(cli, argc, argv, 0, 1);
	cli_connect(cli);
	char *text = text_arg(optind < argc ? argv[optind] : NULL);
	Llamad__Tokenize tk = LLAMAD__TOKENIZE__INIT;
	tk.text = text;
	tk.has_add_bos = 1;
	tk.add_bos = bos;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_TOKENIZE;
	req.tokenize = &tk;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_TOKENS);
	const Llamad__Tokens *t = r->tokens;
	size_t n = t ? t->n_tokens : 0;
	if (cli->json) {
		struct json j;
		json_init(&j, stdout);
		json_obj_begin(&j);
		json_key(&j, "tokens");
		json_u32_array(&j, n ? t->tokens : NULL, n);
		json_key(&j, "pieces");
		json_arr_begin(&j);
		for (size_t i = 0; t && i < t->n_pieces; i++)
			json_str(&j, t->pieces[i]);
		json_arr_end(&j);
		json_obj_end(&j);
		json_end(&j);
	} else {
		for (size_t i = 0; i < n; i++) {
			printf("%6u  ", t->tokens[i]);
			print_piece(i < t->n_pieces ? t->pieces[i] : NULL);
			fputc('\n', stdout);
		}
	}
	cli_flush_stdout();
	if (cli->verbose)
		fprintf(stderr, "llamactl: %zu tokens\n", n);
	llamad__response__free_unpacked(r, NULL);
	free(text);
	return EXIT_OK;
}

static void human_duration(char *buf, size_t n, double s)
{
	unsigned long long t = s > 0 ? (unsigned long long)s : 0;
	if (t >= 86400)
		snprintf(buf, n, "%llud %lluh %llum", t / 86400, t % 86400 / 3600, t % 3600 / 60);
	else if (t >= 3600)
		snprintf(buf, n, "%lluh %llum %llus", t / 3600, t % 3600 / 60, t % 60);
	else if (t >= 60)
		snprintf(buf, n, "%llum %llus", t / 60, t % 60);
	else
		snprintf(buf, n, "%.1fs", s);
}

static void json_status(const Llamad__Status *s)
{
	struct json j;
	json_init(&j, stdout);
	json_obj_begin(&j);
	json_key(&j, "server"); json_str(&j, s->server);
	json_key(&j, "model"); json_str(&j, s->model);
	json_key(&j, "backend"); json_str(&j, s->backend);
	json_key(&j, "threads"); json_u64(&j, s->threads);
	json_key(&j, "uptime_s"); json_double(&j, round(s->uptime_s * 1e3) / 1e3);
	json_key(&j, "sessions"); json_u64(&j, s->sessions);
	json_key(&j, "active"); json_u64(&j, s->active);
	json_key(&j, "connections"); json_u64(&j, s->connections);
	json_key(&j, "kv_blocks_total"); json_u64(&j, s->kv_blocks_total);
	json_key(&j, "kv_blocks_free"); json_u64(&j, s->kv_blocks_free);
	json_key(&j, "kv_block_tokens"); json_u64(&j, s->kv_block_tokens);
	json_key(&j, "kv_bytes_total"); json_u64(&j, s->kv_bytes_total);
	json_key(&j, "weight_bytes"); json_u64(&j, s->weight_bytes);
	json_key(&j, "context_length"); json_u64(&j, s->context_length);
	json_key(&j, "rss_bytes"); json_u64(&j, s->rss_bytes);
	json_key(&j, "state_dir"); json_str(&j, s->state_dir);
	json_key(&j, "chat_template"); json_str(&j, s->chat_template);
	json_key(&j, "sessions_in_ram"); json_u64(&j, s->sessions_in_ram);
	json_key(&j, "sessions_on_disk"); json_u64(&j, s->sessions_on_disk);
	json_key(&j, "ram_bytes_used"); json_u64(&j, s->ram_bytes_used);
	json_key(&j, "ram_bytes_total"); json_u64(&j, s->ram_bytes_total);
	json_key(&j, "counters");
	if (s->counters) {
		const Llamad__Counters *c = s->counters;
		json_obj_begin(&j);
		json_key(&j, "requests"); json_u64(&j, c->requests);
		json_key(&j, "errors"); json_u64(&j, c->errors);
		json_key(&j, "connections"); json_u64(&j, c->connections);
		json_key(&j, "prefilled_tokens"); json_u64(&j, c->prefilled_tokens);
		json_key(&j, "generated_tokens"); json_u64(&j, c->generated_tokens);
		json_key(&j, "forward_passes"); json_u64(&j, c->forward_passes);
		json_key(&j, "cow_copies"); json_u64(&j, c->cow_copies);
		json_key(&j, "evictions_ram"); json_u64(&j, c->evictions_ram);
		json_key(&j, "evictions_disk"); json_u64(&j, c->evictions_disk);
		json_key(&j, "restores"); json_u64(&j, c->restores);
		json_key(&j, "saves"); json_u64(&j, c->saves);
		json_key(&j, "save_errors"); json_u64(&j, c->save_errors);
		json_obj_end(&j);
	} else {
		json_null(&j);
	}
	json_obj_end(&j);
	json_end(&j);
}

static int cmd_status(struct cli *cli, int argc, char **argv)
{
	parse_common(cli, argc, argv);
	want_args_at(cli, argc, argv, 0, 0);
	cli_connect(cli);
	Llamad__GetStatus gs = LLAMAD__GET_STATUS__INIT;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_STATUS;
	req.status = &gs;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_STATUS);
	const Llamad__Status *s = r->status;
	if (cli->json) {
		json_status(s);
	} else {
		char up[64], kv[32], w[32], rss[32];
		human_duration(up, sizeof(up), s->uptime_s);
		human_bytes(kv, sizeof(kv), s->kv_bytes_total);
		human_bytes(w, sizeof(w), s->weight_bytes);
		human_bytes(rss, sizeof(rss), s->rss_bytes);
		printf("server:       %s\n", s->server ? s->server : "?");
		printf("model:        %s\n", s->model ? s->model : "?");
		printf("backend:      %s", s->backend ? s->backend : "?");
		if (s->has_threads && !(s->backend && strstr(s->backend, "thread")))
			printf(", %u threads", s->threads);
		printf("\nuptime:       %s\n", up);
		printf("context:      %u tokens\n", s->context_length);
		printf("sessions:     %u (%u active, %u in host memory, %u on disk)\n", s->sessions,
		       s->active, s->sessions_in_ram, s->sessions_on_disk);
		char ru[32], rt[32];
		human_bytes(ru, sizeof(ru), s->ram_bytes_used);
		human_bytes(rt, sizeof(rt), s->ram_bytes_total);
		if (s->chat_template && *s->chat_template)
			printf("template:     %s\n", s->chat_template);
		printf("state dir:    %s\n", s->state_dir && *s->state_dir ? s->state_dir
							    : "none (sessions are not saved)");
		printf("connections:  %u open\n", s->connections);
		printf("kv cache:     %u of %u blocks free (%u tokens each), %s\n",
		       s->kv_blocks_free, s->kv_blocks_total, s->kv_block_tokens, kv);
		printf("evicted K/V:  %s of %s host memory\n", ru, rt);
		printf("weights:      %s\n", w);
		if (s->has_rss_bytes)
			printf("rss:          %s\n", rss);
		if (s->counters) {
			const Llamad__Counters *c = s->counters;
			printf("requests:     %llu (%llu errors), %llu connections accepted\n",
			       (unsigned long long)c->requests, (unsigned long long)c->errors,
			       (unsigned long long)c->connections);
			printf("tokens:       %llu prefilled, %llu generated\n",
			       (unsigned long long)c->prefilled_tokens,
			       (unsigned long long)c->generated_tokens);
			printf("passes:       %llu forward, %llu copy-on-write copies\n",
			       (unsigned long long)c->forward_passes,
			       (unsigned long long)c->cow_copies);
			printf("evictions:    %llu to host memory, %llu to disk; %llu restores\n",
			       (unsigned long long)c->evictions_ram,
			       (unsigned long long)c->evictions_disk,
			       (unsigned long long)c->restores);
			printf("state files:  %llu written, %llu failed\n",
			       (unsigned long long)c->saves, (unsigned long long)c->save_errors);
		}
	}
	cli_flush_stdout();
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}

/* ---- help (the command) ---------------------------------------------------- */

static const struct command *find_command(const char *name)
{
	for (const struct command *c = commands; c->name; c++)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

static int cmd_help(struct cli *cli, int argc, char **argv)
{
	parse_common(cli, argc, argv);
	want_args_at(cli, argc, argv, 0, 1);
	struct cli tmp = *cli;
	tmp.cmd = NULL;
	if (optind < argc) {
		tmp.cmd = find_command(argv[optind]);
		if (!tmp.cmd)
			cli_usage_error(cli, "unknown command '%s'", argv[optind]);
	}
	cli_print_help(&tmp, stdout);
	cli_flush_stdout();
	return EXIT_OK;
}

/* ---- main ------------------------------------------------------------------ */

static const struct command commands[] = {
	{ "chat", "[--session NAME] [--system TEXT] [--template llama3|llama2|raw] [OPTIONS]",
	  "chat in a session (interactive; or one turn from stdin)", chat_help, cmd_chat },
	{ "summarize", "[--max-tokens N] [--session NAME] [OPTIONS] < TEXT",
	  "summarize stdin (long input in pieces)", summarize_help, cmd_summarize },
	{ "generate", "[--session NAME] [--raw] [OPTIONS] [PROMPT | -]",
	  "add a turn (or not) and stream the answer", generate_help, cmd_generate },
	{ "sessions", "", "list sessions", sessions_help, cmd_sessions },
	{ "show", "NAME [--transcript] [--last N] [--from K] [--ids]",
	  "show a session's info, or its turns", show_help, cmd_show },
	{ "fork", "SRC DST", "fork a session", fork_help, cmd_fork },
	{ "drop", "NAME", "drop a session", drop_help, cmd_drop },
	{ "save", "NAME | --all", "write sessions to the state directory now", save_help,
	  cmd_save },
	{ "tokenize", "[--bos] [TEXT | -]", "show the tokens of a text", tokenize_help,
	  cmd_tokenize },
	{ "status", "", "show the daemon's status", status_help, cmd_status },
	{ "help", "[COMMAND]", "help on a command", help_help, cmd_help },
	{ 0 },
};

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "version", no_argument, NULL, OPT_VERSION },
		{ 0 },
	};
	setlocale(LC_CTYPE, "");
	signal(SIGPIPE, SIG_IGN);

	struct cli cli;
	memset(&cli, 0, sizeof(cli));
	conn_init(&cli.conn);

	argv[0] = "llamactl";
	int o;
	while ((o = getopt_long(argc, argv, "+hv", opts, NULL)) != -1) {
		if (o == OPT_VERSION) {
			printf("llamactl %s\n", LLAMACTL_VERSION);
			cli_flush_stdout();
			return EXIT_OK;
		}
		cli_opt(&cli, NULL, o, optarg);
	}
	if (optind >= argc)
		cli_usage_error(&cli, "missing command");
	const struct command *cmd = find_command(argv[optind]);
	if (!cmd)
		cli_usage_error(&cli, "unknown command '%s'", argv[optind]);
	cli.cmd = cmd;

	/* The command sees argv[0] = "llamactl NAME", so getopt's messages
	 * name it. */
	char prog[64];
	snprintf(prog, sizeof(prog), "llamactl %s", cmd->name);
	int sub_argc = argc - optind;
	char **sub_argv = &argv[optind];
	sub_argv[0] = prog;
	optind = 0;   /* GNU getopt: start over */

	if (!cli.socket)
		cli.socket = conn_default_path(cli.socket_buf, sizeof(cli.socket_buf));
	int rc = cmd->run(&cli, sub_argc, sub_argv);
	conn_close(&cli.conn);
	return rc;
}
