/*
 * client/cmd_drop.c — `llamactl drop NAME`: drop a session.
 */
#include "client/cli.h"

static int cmd_drop(struct cli *cli, int argc, char **argv);

const struct command cmd_drop_entry = {
	.name = "drop",
	.args = "NAME",
	.summary = "drop a session",
	.help =
"Drop session NAME and free its KV cache.\n",
	.run = cmd_drop,
};

static int cmd_drop(struct cli *cli, int argc, char **argv)
{
	cli_begin(cli, argc, argv, 1, 1);
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
