/*
 * client/cli_gen.c — llamactl's generation: one Generate streamed to the terminal or as JSON
 * events, and what is said when it ends (the reason, a context shift) (cli.h).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"
#include "util/grow.h"

struct gen_ctx {
	const struct gen_req *g;
	struct gen_result *res;
	int write_errno;
};

/* One token event as a JSON line on stdout, flushed. */
static int json_token_event(const Llamad__TokenEvent *t)
{
	Llamad__TokenEvent none = LLAMAD__TOKEN_EVENT__INIT;
	pbjson_line("{s:s, M}", "event", "token", t ? &t->base : &none.base);
	return fflush(stdout) != 0 || ferror(stdout) ? -EIO : 0;
}

static int on_token(void *ctx, const Llamad__Response *r)
{
	struct gen_ctx *x = ctx;
	const char *t = r->token ? r->token->text : NULL;
	size_t n = t ? strlen(t) : 0;
	if (x->g->events && json_token_event(r->token) != 0) {
		x->write_errno = errno ? errno : EIO;
		return -EIO;
	}
	if (n == 0)
		return 0;
	if (x->g->echo && x->g->after_label && !x->res->last && !isspace((unsigned char)t[0]) &&
	    fputc(' ', x->g->echo) == EOF) {
		x->write_errno = errno ? errno : EIO;
		return -EIO;
	}
	x->res->last = t[n - 1];
	if (x->g->echo) {
		/* One event, one write: the daemon sends whole characters. */
		if (fwrite(t, 1, n, x->g->echo) != n || fflush(x->g->echo) != 0) {
			x->write_errno = errno ? errno : EIO;
			return -EIO;
		}
	}
	if (x->g->collect)
		return gen_result_add(x->res, t, n);
	return 0;
}

int gen_result_add(struct gen_result *res, const char *t, size_t n)
{
	if (grow(&res->text, &res->cap, res->len + n + 1, 1, 1024))
		return -ENOMEM;
	memcpy(res->text + res->len, t, n);
	res->len += n;
	res->text[res->len] = '\0';
	return 0;
}

void cli_generate_msg(const struct gen_req *g, Llamad__Generate *gen)
{
	llamad__generate__init(gen);
	gen->session = (char *)g->session;
	if (g->prompt) {
		gen->prompt = (char *)g->prompt;
		gen->has_role = 1;
		gen->role = g->role;
	}
	if (g->opts) {
		const Llamad__SamplerOptions *so = &g->opts->sampler;
		if (so->has_temperature || so->has_top_k || so->has_top_p || so->has_min_p ||
		    so->has_repeat_penalty || so->has_repeat_last_n ||
		    so->has_presence_penalty || so->has_frequency_penalty || so->has_seed)
			gen->sampler = (Llamad__SamplerOptions *)so;
		if (g->opts->has_max_tokens) {
			gen->has_max_tokens = 1;
			gen->max_tokens = g->opts->max_tokens;
		}
		gen->n_stop = g->opts->n_stop;
		gen->stop = (char **)g->opts->stop;
	}
}

void cli_generate(struct cli *cli, const struct gen_req *g, struct gen_result *res)
{
	memset(res, 0, sizeof(*res));
	Llamad__Generate gen;
	cli_generate_msg(g, &gen);
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_GENERATE;
	req.generate = &gen;

	uint64_t id;
	int rc = conn_send(&cli->conn, &req, &id);
	if (rc && g->soft && rc != -EMSGSIZE) {
		res->lost = rc;
		return;
	}
	if (rc)
		cli_die_conn(cli, rc);
	struct gen_ctx x = { g, res, 0 };
	rc = conn_wait(&cli->conn, id, on_token, &x, &res->term, &res->cancelled);
	if (rc == -EINTR) {
		res->interrupted = true;
		res->term = NULL;
		return;
	}
	if (rc && g->soft && !x.write_errno && rc != -ENOMEM) {
		res->lost = rc;   /* the connection broke: the caller goes on */
		res->term = NULL;
		return;
	}
	if (rc && rc != -EIO && g->echo && res->last && res->last != '\n' &&
	    isatty(fileno(g->echo))) {
		fputc('\n', g->echo);   /* the message below on a line of its own */
		fflush(g->echo);
	}
	if (rc == -EIO && x.write_errno)
		cli_write_failed(x.write_errno);
	if (rc == -ENOMEM)
		cli_die_local("out of memory");
	if (rc)
		cli_die_conn(cli, rc);
}

void gen_result_done(struct gen_result *res)
{
	free(res->text);
	if (res->term)
		llamad__response__free_unpacked(res->term, NULL);
	memset(res, 0, sizeof(*res));
}

void cli_report_done(const struct cli *cli, const Llamad__Done *d)
{
	int reason = d->has_reason ? (int)d->reason : 0;
	if (cli->verbose) {
		double gs = d->generate_ms > 0 ? d->generated_tokens * 1e3 / d->generate_ms : 0;
		double ps = d->prefill_ms > 0 ? d->prompt_tokens * 1e3 / d->prefill_ms : 0;
		/* prompt tokens other sessions' blocks held (prefix sharing):
		 * not prefilled, so not in the rate */
		char shared[48] = "";
		if (d->has_shared_tokens && d->shared_tokens > 0)
			snprintf(shared, sizeof(shared), " (+%u shared)", d->shared_tokens);
		fprintf(stderr, "llamactl: prompt %u tokens%s in %.1f ms (%.1f tok/s); generated "
			"%u tokens in %.1f ms (%.1f tok/s); stop: %s; session %u tokens\n",
			d->prompt_tokens, shared, d->prefill_ms, ps, d->generated_tokens,
			d->generate_ms, gs, cli_reason_name(reason), d->session_tokens);
	} else if (reason == LLAMAD__STOP_REASON__STOP_CONTEXT_FULL) {
		if (cli->policy == LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT)
			fprintf(stderr, "llamactl: the answer was cut: what the session must keep "
				"(its system prompt and the question) fills its context (%u tokens); "
				"a shorter question or system prompt leaves room\n",
				d->session_tokens);
		else if (cli->policy == LLAMAD__CONTEXT_POLICY__CONTEXT_ERROR)
			fprintf(stderr, "llamactl: the answer was cut: the session's context is full "
				"and its context policy is error (--context-policy shift lets the "
				"oldest turns make room)\n");
		else
			fprintf(stderr, "llamactl: the session's context is full; the answer was cut "
				"(--context-policy shift lets the oldest turns make room)\n");
	}
}

void cli_json_done_line(const char *session, const struct gen_result *res)
{
	pbjson_line("{s:s, s:s, s:s#, M}", "event", "done", "session", session, "text",
		    res->text ? res->text : "", res->len, &res->term->done->base);
}

int cli_gen_finish(struct cli *cli, const char *session, struct gen_result *res)
{
	const Llamad__Done *d = res->term->done;
	if (cli->json) {
		cli_json_done_line(session, res);
	} else {
		fputc('\n', stdout);
	}
	cli_flush_stdout();
	cli_report_done(cli, d);
	gen_result_done(res);
	return EXIT_OK;
}

bool cli_note_shift(FILE *f, bool color, const Llamad__Done *d)
{
	if (!d->has_dropped_turns || !d->has_dropped_tokens || !d->has_slid_tokens)
		return false;
	uint32_t slid = d->slid_tokens <= d->dropped_tokens ? d->slid_tokens : d->dropped_tokens;
	uint32_t turn_tokens = d->dropped_tokens - slid;
	if (d->dropped_turns == 0 && slid == 0)
		return true;
	fprintf(f, "%s[the context was full: ", color ? "\033[2m" : "");
	if (d->dropped_turns)
		fprintf(f, "the oldest turns were dropped (%u turn%s, %u token%s)%s",
			d->dropped_turns, d->dropped_turns == 1 ? "" : "s", turn_tokens,
			turn_tokens == 1 ? "" : "s", slid ? " and " : " to make room");
	if (slid)
		fprintf(f, "the answer's first %u token%s slid out to make room", slid,
			slid == 1 ? "" : "s");
	fprintf(f, "]%s\n", color ? "\033[0m" : "");
	return true;
}

void cli_note_shift_kept(FILE *f, bool color, uint32_t kept)
{
	fprintf(f, "%s[the context was full: the oldest turns were dropped to make room; "
		"%u turns kept]%s\n", color ? "\033[2m" : "", kept, color ? "\033[0m" : "");
}

void cli_note_max_tokens(FILE *f, bool color, uint32_t n)
{
	fprintf(f, "%s[the answer stopped at max_tokens (%u token%s); -n raises it]%s\n",
		color ? "\033[2m" : "", n, n == 1 ? "" : "s", color ? "\033[0m" : "");
}
