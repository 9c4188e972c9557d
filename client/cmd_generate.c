/*
 * client/cmd_generate.c — `llamactl generate`: add a turn (or not) and
 * stream the answer.
 */
#include <stdlib.h>

#include "client/cli.h"

static int cmd_generate(struct cli *cli, int argc, char **argv);

const struct command cmd_generate_entry = {
	.name = "generate",
	.args = "[--session NAME] [--raw] [OPTIONS] [PROMPT | -]",
	.summary = "add a turn (or not) and stream the answer",
	.help =
"Append PROMPT (or stdin with \"-\") to the session as a user turn and stream\n"
"the model's answer to stdout. Without PROMPT, continue session NAME, which\n"
"must exist, from where it stands. Without --session, use a throw-away\n"
"session (a PROMPT is then required).\n"
"\n"
"  -s, --session NAME      the session (created if missing, given a PROMPT)\n"
"      --raw               PROMPT is raw text, not a user turn; a session this\n"
"                          creates uses the raw template (no chat format)\n"
"      --context-policy P  when the session is full: error (the default of the\n"
"                          daemon's, usually) or shift (drop the oldest turns;\n"
"                          a long answer slides on; a line on stderr says\n"
"                          what went); applies to an existing session too\n"
"\n"
CLI_SAMPLER_HELP
"\n"
"With --json, JSON lines on stdout, one object a line, flushed as they come:\n"
"{\"event\":\"token\",\"text\":..,\"tokens\":[..]} per token event, then\n"
"{\"event\":\"done\",\"session\":..,\"text\":(all of it),\"reason\":.., counts}, or\n"
"{\"event\":\"error\",\"error\":..,\"code\":..,\"message\":..} (the exit status is\n"
"the same as without --json).\n",
	.run = cmd_generate,
};

static int cmd_generate(struct cli *cli, int argc, char **argv)
{
	enum { O_RAW = OPT_CMD };
	static const struct option opts[] = {
		CLI_COMMON_OPTS, CLI_SAMPLER_OPTS, CLI_SESSION_OPTS,
		{ "raw", no_argument, NULL, O_RAW },
		{ 0 },
	};
	struct gen_opts g;
	gen_opts_init(&g);
	bool raw = false;
	int o;
	while ((o = getopt_long(argc, argv, "hvn:s:", opts, NULL)) != -1) {
		if (o == O_RAW)
			raw = true;
		else
			cli_opt(cli, &g, o, optarg);
	}
	const char *session = g.session;
	cli_want_args(cli, argc, argv, 0, 1);
	if (optind >= argc && !session)
		cli_usage_error(cli, "no PROMPT (- reads stdin); to continue a session, "
				"--session NAME");
	cli_connect(cli);
	char *prompt = optind < argc ? cli_text_arg(argv[optind]) : NULL;
	if (!prompt) {   /* continue: the session must exist (GetInfo says) */
		Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
		gi.session = (char *)session;
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		q.op_case = LLAMAD__REQUEST__OP_INFO;
		q.info = &gi;
		llamad__response__free_unpacked(cli_call(cli, &q, LLAMAD__RESPONSE__BODY_SESSION),
						NULL);
	}

	char eph[64];
	Llamad__Template tmpl = raw ? LLAMAD__TEMPLATE__TEMPLATE_RAW
				    : LLAMAD__TEMPLATE__TEMPLATE_DEFAULT;
	struct open_opts oo = { .tmpl = tmpl, .policy = g.policy };
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
	Llamad__Done d = *cli_expect(t, LLAMAD__RESPONSE__BODY_DONE)->done;
	d.stop = NULL;   /* the counts outlive res; its strings do not */
	int rc = cli_gen_finish(cli, session == eph ? NULL : session, &res);
	if (!cli->json)
		cli_note_shift(stderr, false, &d);
	return rc;
}
