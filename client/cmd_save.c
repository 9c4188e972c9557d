/*
 * client/cmd_save.c — `llamactl save NAME | --all`: write sessions to the
 * state directory now.
 */
#include <stdio.h>

#include "client/cli.h"

static int cmd_save(struct cli *cli, int argc, char **argv);

const struct command cmd_save_entry = {
	.name = "save",
	.args = "NAME | --all",
	.summary = "write sessions to the state directory now",
	.help =
"Write session NAME (or, with --all, every session you own; root: all) to\n"
"the daemon's state directory now, instead of waiting for it to go idle.\n"
"\n"
"      --all               every session\n",
	.run = cmd_save,
};

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
	cli_want_args(cli, argc, argv, all ? 0 : 1, all ? 0 : 1);
	if (!all)
		cli_want_session(cli, argv[optind]);
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
	cli_human_bytes(b, sizeof(b), r->saved->bytes);
	if (cli->json) {
		cli_json_message(&r->saved->base);
		cli_flush_stdout();
	} else if (cli->verbose || all) {
		char bb[32];
		cli_human_bytes(bb, sizeof(bb), r->saved->block_bytes);
		fprintf(stderr, "llamactl: saved %u session%s (%s%s%s%s)\n", r->saved->sessions,
			r->saved->sessions == 1 ? "" : "s", b,
			r->saved->block_bytes ? ", and " : "", r->saved->block_bytes ? bb : "",
			r->saved->block_bytes ? " of new shared blocks" : "");
	}
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}
