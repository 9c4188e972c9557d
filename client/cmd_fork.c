/*
 * client/cmd_fork.c — `llamactl fork SRC DST`: fork a session.
 */
#include <stdio.h>

#include "client/cli.h"

static int cmd_fork(struct cli *cli, int argc, char **argv);

const struct command cmd_fork_entry = {
	.name = "fork",
	.args = "SRC DST",
	.summary = "fork a session",
	.help =
"Fork session SRC into a new session DST sharing its history (and its KV\n"
"cache, copy-on-write). Prints nothing, or DST's info with --json.\n",
	.run = cmd_fork,
};

static int cmd_fork(struct cli *cli, int argc, char **argv)
{
	cli_parse_common(cli, argc, argv);
	cli_want_args(cli, argc, argv, 2, 2);
	Llamad__Fork f = LLAMAD__FORK__INIT;
	f.session = (char *)cli_want_session(cli, argv[optind]);
	f.target = (char *)cli_want_session(cli, argv[optind + 1]);
	cli_connect(cli);
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_FORK;
	req.fork = &f;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SESSION);
	if (cli->json) {
		cli_json_message(&r->session->base);
		cli_flush_stdout();
	} else if (cli->verbose) {
		fprintf(stderr, "llamactl: forked %s to %s (%u tokens)\n", f.session,
			f.target, r->session->tokens);
	}
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}
