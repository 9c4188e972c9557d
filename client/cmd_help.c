/*
 * client/cmd_help.c — `llamactl help [COMMAND]`: the help of a command, or
 * the global help.
 */
#include <stdio.h>

#include "client/cli.h"

static int cmd_help(struct cli *cli, int argc, char **argv);

const struct command cmd_help_entry = {
	.name = "help",
	.args = "[COMMAND]",
	.summary = "help on a command",
	.help =
"Print the help of COMMAND, or the global help.\n",
	.run = cmd_help,
};

static int cmd_help(struct cli *cli, int argc, char **argv)
{
	cli_parse_common(cli, argc, argv);
	cli_want_args(cli, argc, argv, 0, 1);
	struct cli tmp = *cli;
	tmp.cmd = NULL;
	if (optind < argc) {
		tmp.cmd = cli_find_command(cli, argv[optind]);
		if (!tmp.cmd)
			cli_usage_error(cli, "unknown command '%s'", argv[optind]);
	}
	cli_print_help(&tmp, stdout);
	cli_flush_stdout();
	return EXIT_OK;
}
