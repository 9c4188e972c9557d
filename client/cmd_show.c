/*
 * client/cmd_show.c — `llamactl show NAME`: a session's info, or its turns
 * (--transcript).
 */
#include <stdio.h>
#include <time.h>

#include "client/cli.h"

static int cmd_show(struct cli *cli, int argc, char **argv);

const struct command cmd_show_entry = {
	.name = "show",
	.args = "NAME [--transcript] [--last N] [--from K] [--ids]",
	.summary = "show a session's info, or its turns",
	.help =
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
"transcript: session, turns, first, template, location, system, busy and\n"
"items, an array of {index, role, text, tokens, start, generated, stop_reason,\n"
"truncated[, token_ids]}.\n",
	.run = cmd_show,
};

static void human_time(char *buf, size_t n, int64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	if (ms <= 0 || !localtime_r(&t, &tm) || !strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm))
		snprintf(buf, n, "-");
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
	cli_human_bytes(kv, sizeof(kv), s->kv_bytes);
	cli_human_age(age, sizeof(age), s->last_use_ms);
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
		cli_human_bytes(fb, sizeof(fb), s->file_bytes);
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
		cli_print_dropped(stdout, t);
		if (t->first > 0)
			printf("(%u earlier turn%s not shown)\n", t->first, t->first == 1 ? "" : "s");
		putchar('\n');
		return;
	}
	struct json *j = &x->j;
	json_obj_begin(j);
	pbjson_members(j, &t->base);   /* all but the items: */
	json_key(j, "items");          /* show_turn writes them, page by page */
	json_arr_begin(j);
}

static void show_turn(void *ctx, const Llamad__Turn *u)
{
	struct show_tx *x = ctx;
	if (x->json)
		pbjson_object(&x->j, &u->base);
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
	cli_want_args(cli, argc, argv, 1, 1);
	cli_want_session(cli, argv[optind]);
	cli_connect(cli);
	if (transcript)
		return show_transcript(cli, argv[optind], from, last, ids);
	Llamad__Response *r = get_info(cli, argv[optind]);
	if (cli->json) {
		cli_json_message(&r->session->base);
	} else {
		print_session(r->session);
	}
	cli_flush_stdout();
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}
