/*
 * client/cmd_cancel.c — `llamactl cancel NAME`: stop what runs or waits in
 * a session, whoever started it.
 */
#include "client/cli.h"

static int cmd_cancel(struct cli *cli, int argc, char **argv);

const struct command cmd_cancel_entry = {
	.name = "cancel",
	.args = "NAME",
	.summary = "stop what runs or waits in a session",
	.help =
"Stop the request running in session NAME (a generation ends as if cut:\n"
"what it produced so far stays in the session) and every request waiting\n"
"for it, whichever client or connection sent them. Succeeds also when\n"
"nothing runs. Prints nothing, or {\"cancelled\":NAME} with --json.\n",
	.run = cmd_cancel,
};

static int cmd_cancel(struct cli *cli, int argc, char **argv)
{
	const char *name = cli_begin_session(cli, argc, argv);
	cli_cancel_session(cli, name);
	if (cli->json)
		cli_json_named("cancelled", name);
	return EXIT_OK;
}
