/*
 * client/llamactl.c — llamactl, the shell client of llamad: main. The
 * global options, then the command named next, found in the command table
 * (cmd.c) and run with the rest of the arguments. Each command is a file,
 * client/cmd_NAME.c, whose entry carries its usage and help; cli_*.c hold
 * what they share (cli.h), conn.c speaks the protocol.
 */
#include <getopt.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"

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
	cli.commands = cmd_table;
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
	const struct command *cmd = cli_find_command(&cli, argv[optind]);
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

	if (!cli.socket) {
		cli.n_candidates = path_client_sockets(cli.candidates);
		if (cli.n_candidates < 0)
			cli_die_local("out of memory");
		cli.socket = cli.candidates[0];
	}
	int rc = cmd->run(&cli, sub_argc, sub_argv);
	conn_close(&cli.conn);
	for (int i = 0; i < cli.n_candidates; i++)
		free(cli.candidates[i]);
	return rc;
}
