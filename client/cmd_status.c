/*
 * client/cmd_status.c — `llamactl status`: the daemon's status.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "client/cli.h"
#include "util/hist.h"

static int cmd_status(struct cli *cli, int argc, char **argv);

const struct command cmd_status_entry = {
	.name = "status",
	.args = "",
	.summary = "show the daemon's status",
	.help =
"Print the daemon's status: model, backend, uptime, sessions, KV cache (in\n"
"blocks, bytes, tokens and contexts), prefix sharing (on or off, the free\n"
"blocks that still hold a prefix, the prompt tokens taken from shared\n"
"blocks), counters, and the block files saved sessions share. With -v,\n"
"also the latencies since the daemon started: time to first token and\n"
"time between tokens (count, mean, and p50 / p99 estimated from the\n"
"histogram's buckets).\n",
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

/* s seconds for people: "850 µs", "35.2 ms", "1.25 s". */
static void human_seconds(char *buf, size_t n, double s)
{
	if (s < 1e-3)
		snprintf(buf, n, "%.0f µs", s * 1e6);
	else if (s < 1)
		snprintf(buf, n, "%.*f ms", s < 0.1 ? 1 : 0, s * 1e3);
	else
		snprintf(buf, n, "%.2f s", s);
}

/* One line of a latency histogram (-v): "LABEL N WHAT, mean M, p50 ~A,
 * p99 ~B"; a histogram whose counts do not fit its bounds is said so. */
static void print_hist(const char *label, const Llamad__Histogram *h, const char *what)
{
	printf("%-14s", label);
	if (!h->count) {
		printf("none yet\n");
		return;
	}
	char mean[32];
	human_seconds(mean, sizeof(mean), h->sum / (double)h->count);
	printf("%llu %s, mean %s", (unsigned long long)h->count, what, mean);
	if (h->n_le == 0 || h->n_le > HIST_MAX_BOUNDS || h->n_counts != h->n_le + 1) {
		printf(" (buckets unreadable)\n");
		return;
	}
	static const struct {
		const char *name;
		double q;
	} qs[] = { { "p50", 0.5 }, { "p99", 0.99 } };
	for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		int above;
		double v = hist_quantile(h->le, h->n_le, h->counts, qs[i].q, &above);
		char b[32];
		if (isnan(v))
			continue;
		human_seconds(b, sizeof(b), v);
		printf(", %s %s%s", qs[i].name, above ? "> " : "~", b);
	}
	putchar('\n');
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
		/* a user other than root and llamad's own sees its own figures
		 * only (Status.own): what counts others' work is not sent */
		if (s->has_connections)
			printf("connections:  %u open\n", s->connections);
		/* what the pool holds, in tokens and in contexts of the session
		 * limit: under one, a session cannot reach its context */
		uint64_t kv_tokens = (uint64_t)s->kv_blocks_total * s->kv_block_tokens;
		printf("kv cache:     ");
		if (s->has_kv_blocks_free)
			printf("%u of ", s->kv_blocks_free);
		printf("%u blocks%s (%u tokens each), %s%s%s: %llu tokens, %.1f contexts%s\n",
		       s->kv_blocks_total, s->has_kv_blocks_free ? " free" : "", s->kv_block_tokens,
		       kv, s->kv_type && *s->kv_type ? " of " : "", s->kv_type ? s->kv_type : "",
		       (unsigned long long)kv_tokens,
		       s->context_length ? (double)kv_tokens / s->context_length : 0.0,
		       s->context_length && kv_tokens < s->context_length ? " (less than one)" : "");
		/* prefix sharing: free blocks that still hold a prefix its owner's
		 * next session may take (a daemon that does not say: no line) */
		if (s->has_prefix_sharing) {
			printf("sharing:      prefix sharing %s", s->prefix_sharing ? "on" : "off");
			if (s->has_kv_blocks_cached)
				printf(", %u free blocks cached", s->kv_blocks_cached);
			if (s->counters && s->counters->has_prefix_hit_tokens)
				printf(", %llu prompt tokens shared",
				       (unsigned long long)s->counters->prefix_hit_tokens);
			putchar('\n');
		}
		if (s->has_ram_bytes_used)
			printf("evicted K/V:  %s of %s host memory\n", ru, rt);
		printf("weights:      %s\n", w);
		if (s->has_rss_bytes)
			printf("rss:          %s\n", rss);
		if (s->counters) {
			const Llamad__Counters *c = s->counters;
			printf("requests:     %llu", (unsigned long long)c->requests);
			if (c->has_errors)
				printf(" (%llu errors), %llu connections accepted",
				       (unsigned long long)c->errors, (unsigned long long)c->connections);
			printf("\ntokens:       %llu prefilled, %llu generated\n",
			       (unsigned long long)c->prefilled_tokens,
			       (unsigned long long)c->generated_tokens);
		}
		if (s->counters && s->counters->has_forward_passes) {
			const Llamad__Counters *c = s->counters;
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
			if (s->counters && s->counters->has_block_files_written)
				printf("; %llu written, %llu removed, %llu refused",
				       (unsigned long long)s->counters->block_files_written,
				       (unsigned long long)s->counters->block_files_removed,
				       (unsigned long long)s->counters->block_files_refused);
			putchar('\n');
		}
		if (s->has_disk_bytes) {
			char db[32], dq[32];
			cli_human_bytes(db, sizeof(db), s->disk_bytes);
			cli_human_bytes(dq, sizeof(dq), s->disk_quota_bytes);
			printf("disk:         %s of saved sessions", db);
			if (s->disk_quota_bytes)
				printf(", %s your share (disk_share_per_uid)", dq);
			putchar('\n');
		}
		if (s->own)
			printf("counts:       your own (root and llamad's user see every user's)\n");
		if (cli->verbose && s->ttft)
			print_hist("first token:", s->ttft, "generations");
		if (cli->verbose && s->token_time)
			print_hist("token time:", s->token_time, "intervals");
	}
	cli_flush_stdout();
	llamad__response__free_unpacked(r, NULL);
	return EXIT_OK;
}
