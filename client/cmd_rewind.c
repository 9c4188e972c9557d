/*
 * client/cmd_rewind.c — `llamactl rewind NAME`: remove a session's last
 * turn.
 */
#include <stdio.h>

#include "client/cli.h"

static int cmd_rewind(struct cli *cli, int argc, char **argv);

const struct command cmd_rewind_entry = {
	.name = "rewind",
	.args = "NAME",
	.summary = "remove a session's last turn",
	.help =
"Remove the last turn of session NAME (an answer, a message, a system\n"
"turn), its tokens and their KV cache, so the next turn starts from the one\n"
"before. Waits if the session is busy. Prints nothing (with -v, the\n"
"session's length after it on stderr), or the session's info with --json.\n",
	.run = cmd_rewind,
};

static int cmd_rewind(struct cli *cli, int argc, char **argv)
{
	Llamad__Rewind rw = LLAMAD__REWIND__INIT;
	rw.session = (char *)cli_begin_session(cli, argc, argv);
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_REWIND;
	req.rewind = &rw;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_SESSION);
	if (cli->json) {
		cli_json_message(&r->session->base);
		cli_flush_stdout();
	} else if (cli->verbose) {
		fprintf(stderr, "llamactl: rewound %s to %u tokens, %u turns\n", rw.session,
			r->session->tokens, r->session->turns);
	}
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}
