/*
 * client/cmd_drop.c — `llamactl drop [--force] NAME`: drop a session.
 */
#include "client/cli.h"

static int cmd_drop(struct cli *cli, int argc, char **argv);

const struct command cmd_drop_entry = {
	.name = "drop",
	.args = "[--force] NAME",
	.summary = "drop a session",
	.help =
"Drop session NAME, its KV cache and its state file. If the session is\n"
"busy (another client generates in it), drop waits until that request ends;\n"
"--force first cancels what runs or waits in it (as `llamactl cancel`).\n"
"\n"
"  -f, --force             cancel the session's requests, then drop it\n",
	.run = cmd_drop,
};

static int cmd_drop(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "force", no_argument, NULL, 'f' },
		{ 0 },
	};
	bool force = false;
	int o;
	while ((o = getopt_long(argc, argv, "hvf", opts, NULL)) != -1) {
		if (o == 'f')
			force = true;
		else
			cli_opt(cli, NULL, o, optarg);
	}
	cli_want_args(cli, argc, argv, 1, 1);
	const char *name = cli_want_session(cli, argv[optind]);
	cli_connect(cli);
	if (force)
		cli_cancel_session(cli, name);
	cli_drop_session(cli, name, false);
	if (cli->json)
		cli_json_named("dropped", name);
	return EXIT_OK;
}
