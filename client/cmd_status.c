/*
 * client/cmd_status.c — `llamactl status`: the daemon's status.
 */
#include <stdio.h>
#include <string.h>

#include "client/cli.h"

static int cmd_status(struct cli *cli, int argc, char **argv);

const struct command cmd_status_entry = {
	.name = "status",
	.args = "",
	.summary = "show the daemon's status",
	.help =
"Print the daemon's status: model, backend, uptime, sessions, KV cache (in\n"
"blocks, bytes, tokens and contexts), prefix sharing (on or off, the free\n"
"blocks that still hold a prefix, the prompt tokens taken from shared\n"
"blocks), counters, and the block files saved sessions share.\n",
	.run = cmd_status,
};

static void human_duration(char *buf, size_t n, double s)
{
	unsigned long long t = s > 0 ? (unsigned long long)s : 0;
	if (t >= 86400)
		snprintf(buf, n, "%llud %lluh %llum", t / 86400, t % 86400 / 3600, t % 3600 / 60);
	else if (t >= 3600)
		snprintf(buf, n, "%lluh %llum %llus", t / 3600, t % 3600 / 60, t % 60);
	else if (t >= 60)
		snprintf(buf, n, "%llum %llus", t / 60, t % 60);
	else
		snprintf(buf, n, "%.1fs", s);
}

static int cmd_status(struct cli *cli, int argc, char **argv)
{
	cli_begin(cli, argc, argv, 0, 0);
	Llamad__GetStatus gs = LLAMAD__GET_STATUS__INIT;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_STATUS;
	req.status = &gs;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_STATUS);
	const Llamad__Status *s = r->status;
	if (cli->json) {
		cli_json_message(&s->base);
	} else {
		char up[64], kv[32], w[32], rss[32];
		human_duration(up, sizeof(up), s->uptime_s);
		cli_human_bytes(kv, sizeof(kv), s->kv_bytes_total);
		cli_human_bytes(w, sizeof(w), s->weight_bytes);
		cli_human_bytes(rss, sizeof(rss), s->rss_bytes);
		printf("server:       %s\n", s->server ? s->server : "?");
		printf("model:        %s\n", s->model ? s->model : "?");
		printf("backend:      %s", s->backend ? s->backend : "?");
		if (s->has_threads && !(s->backend && strstr(s->backend, "thread")))
			printf(", %u threads", s->threads);
		printf("\nuptime:       %s\n", up);
		printf("context:      %u tokens\n", s->context_length);
		printf("sessions:     %u (%u active, %u in host memory, %u on disk)\n", s->sessions,
		       s->active, s->sessions_in_ram, s->sessions_on_disk);
		char ru[32], rt[32];
		cli_human_bytes(ru, sizeof(ru), s->ram_bytes_used);
		cli_human_bytes(rt, sizeof(rt), s->ram_bytes_total);
		if (s->chat_template && *s->chat_template)
			printf("template:     %s\n", s->chat_template);
		printf("state dir:    %s\n", s->state_dir && *s->state_dir ? s->state_dir
							    : "none (sessions are not saved)");
		printf("connections:  %u open\n", s->connections);
		/* what the pool holds, in tokens and in contexts of the session
		 * limit: under one, a session cannot reach its context */
		uint64_t kv_tokens = (uint64_t)s->kv_blocks_total * s->kv_block_tokens;
		printf("kv cache:     %u of %u blocks free (%u tokens each), %s%s%s: %llu tokens, "
		       "%.1f contexts%s\n", s->kv_blocks_free, s->kv_blocks_total, s->kv_block_tokens,
		       kv, s->kv_type && *s->kv_type ? " of " : "", s->kv_type ? s->kv_type : "",
		       (unsigned long long)kv_tokens,
		       s->context_length ? (double)kv_tokens / s->context_length : 0.0,
		       s->context_length && kv_tokens < s->context_length ? " (less than one)" : "");
		/* prefix sharing: free blocks that still hold a prefix its owner's
		 * next session may take (a daemon that does not say: no line) */
		if (s->has_prefix_sharing) {
			printf("sharing:      prefix sharing %s, %u free blocks cached", s->prefix_sharing
			       ? "on" : "off", s->kv_blocks_cached);
			if (s->counters)
				printf(", %llu prompt tokens shared",
				       (unsigned long long)s->counters->prefix_hit_tokens);
			putchar('\n');
		}
		printf("evicted K/V:  %s of %s host memory\n", ru, rt);
		printf("weights:      %s\n", w);
		if (s->has_rss_bytes)
			printf("rss:          %s\n", rss);
		if (s->counters) {
			const Llamad__Counters *c = s->counters;
			printf("requests:     %llu (%llu errors), %llu connections accepted\n",
			       (unsigned long long)c->requests, (unsigned long long)c->errors,
			       (unsigned long long)c->connections);
			printf("tokens:       %llu prefilled, %llu generated\n",
			       (unsigned long long)c->prefilled_tokens,
			       (unsigned long long)c->generated_tokens);
			printf("passes:       %llu forward, %llu copy-on-write copies\n",
			       (unsigned long long)c->forward_passes,
			       (unsigned long long)c->cow_copies);
			printf("evictions:    %llu to host memory, %llu to disk; %llu restores\n",
			       (unsigned long long)c->evictions_ram,
			       (unsigned long long)c->evictions_disk,
			       (unsigned long long)c->restores);
			printf("state files:  %llu written, %llu failed, %llu refused and set aside "
			       "(NAME.corrupt)\n", (unsigned long long)c->saves,
			       (unsigned long long)c->save_errors,
			       (unsigned long long)c->files_set_aside);
		}
		/* shared block files of saved sessions (a daemon that does not say:
		 * no line) */
		if (s->has_block_files) {
			char bf[32];
			cli_human_bytes(bf, sizeof(bf), s->block_file_bytes);
			printf("block files:  %u (%s) shared by saved sessions", s->block_files, bf);
			if (s->counters)
				printf("; %llu written, %llu removed, %llu refused",
				       (unsigned long long)s->counters->block_files_written,
				       (unsigned long long)s->counters->block_files_removed,
				       (unsigned long long)s->counters->block_files_refused);
			putchar('\n');
		}
	}
	cli_flush_stdout();
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}
