/*
 * client/cmd.c — llamactl's command table: the entry of each command file
 * (client/cmd_NAME.c), in the order the global help lists them. main puts
 * it in struct cli, where the help and the lookup find it.
 */
#include <stddef.h>

#include "client/cli.h"

extern const struct command cmd_chat_entry, cmd_summarize_entry, cmd_generate_entry,
	cmd_sessions_entry, cmd_show_entry, cmd_fork_entry, cmd_rewind_entry, cmd_cancel_entry,
	cmd_drop_entry, cmd_save_entry, cmd_tokenize_entry, cmd_status_entry, cmd_help_entry;

const struct command *const cmd_table[] = {
	&cmd_chat_entry,
	&cmd_summarize_entry,
	&cmd_generate_entry,
	&cmd_sessions_entry,
	&cmd_show_entry,
	&cmd_fork_entry,
	&cmd_rewind_entry,
	&cmd_cancel_entry,
	&cmd_drop_entry,
	&cmd_save_entry,
	&cmd_tokenize_entry,
	&cmd_status_entry,
	&cmd_help_entry,
	NULL,
};
