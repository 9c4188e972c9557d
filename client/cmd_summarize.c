/*
 * client/cmd_summarize.c — `llamactl summarize`: summarize stdin, in pieces when
 * it does not fit the context.
 *
 * The request is a chat turn under the daemon's default template (llama3
 * or llama2; llama2 when the daemon's default is raw): system "Summarize the
 * user's text concisely.", user "Summarize the following text:\n\n" + text.
 * When the
 * text's tokens plus the template, the instruction and the answer budget
 * exceed the context length, the text is cut into pieces that fit (on
 * paragraph, then line, sentence, word, and finally character boundaries;
 * sizes measured with the daemon's Tokenize), each piece is summarized in its
 * own throw-away session, and the joined summaries are summarized again, in
 * rounds, until they fit one request. A round whose summaries are not shorter
 * than its input ends the command with an error instead of looping. The
 * parts of a round run several at once (SUM_PARALLEL), so that llamad
 * batches them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/cli.h"

#define SUM_SYSTEM "Summarize the user's text concisely."
#define SUM_PREFIX "Summarize the following text:\n\n"
#define SUM_MAX_ROUNDS 64   /* each round halves the text at least (budget <= limit / 2
			     * by default): 2^64 tokens would not reach it */
/* Parts summarized at once, each in its own session: their Open, Generate
 * and Drop are pipelined on the one connection (llamad takes a
 * connection's requests in order, and those on a busy session wait), and
 * llamad runs their steps in one batch. Fewer when the KV cache is small
 * (at most a quarter of it for them). */
#define SUM_PARALLEL 8
#define SUM_DEFAULT_BUDGET 256
/* Tokens kept free beyond the measured template, for BOS/EOS and the
 * tokenizer's merges across piece boundaries. */
#define SUM_MARGIN 8

static int cmd_summarize(struct cli *cli, int argc, char **argv);

const struct command cmd_summarize_entry = {
	.name = "summarize",
	.args = "[--max-tokens N] [--session NAME] [OPTIONS] < TEXT",
	.summary = "summarize stdin (long input in pieces)",
	.help =
"Summarize the text on stdin and print the summary. A text too long for the\n"
"model's context is cut into pieces (on paragraph and line boundaries where\n"
"possible); each piece is summarized, then the summaries are summarized.\n"
"--max-tokens is the length budget of each summary (default: 256 tokens, or a\n"
"quarter of the context length if less).\n"
"\n"
"  -s, --session NAME      give the final summary in session NAME (created if\n"
"                          missing), so you can go on chatting about it;\n"
"                          default: a throw-away session\n"
"\n"
CLI_SAMPLER_HELP
"\n"
"With --json, JSON lines on stdout: {\"event\":\"progress\",...} after each part of a\n"
"long text, the final summary's {\"event\":\"token\",...} events, then\n"
"{\"event\":\"done\",\"summary\":(trimmed),\"text\":(as streamed),\"session\":..,\n"
"\"parts\":..,\"rounds\":..,\"input_tokens\":.., and the counts of the final\n"
"request}; errors as {\"event\":\"error\",...}.\n",
	.run = cmd_summarize,
};

struct summ {
	struct cli *cli;
	Llamad__Template tmpl;  /* of the sessions it opens */
	struct gen_opts g;      /* max_tokens is the answer budget */
	uint32_t ctx;           /* context length */
	uint32_t budget;        /* answer tokens */
	uint32_t overhead;      /* template + system + instruction tokens */
	uint32_t limit;         /* text tokens per request in a fresh session */
	uint32_t final_limit;   /* text tokens of the final request */
	size_t max_bytes;       /* bytes of text we send in one Tokenize */
	unsigned parts;         /* pieces summarized so far */
	unsigned parallel;      /* parts in flight at once */
};

/* A part in flight. */
struct part_run {
	uint64_t open_id, gen_id;  /* gen_id 0: the slot is free */
	size_t chunk;
	char name[64];
	char *prompt;
	struct gen_result res;
};

struct piece {
	size_t off, len;
	uint32_t ntok;
};

struct pieces {
	struct piece *v;
	size_t n, cap;
};

static noreturn void nomem(void)
{
	cli_die_local("out of memory");
}

static void pieces_push(struct pieces *p, size_t off, size_t len, uint32_t ntok)
{
	if (p->n == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 64;
		struct piece *v = realloc(p->v, cap * sizeof(*v));
		if (!v)
			nomem();
		p->v = v;
		p->cap = cap;
	}
	p->v[p->n++] = (struct piece){ off, len, ntok };
}

/* Tokens of text[0..len) without BOS, per the daemon; UINT32_MAX when the
 * text is too large to send in one request. */
static uint32_t count_tokens(struct summ *s, const char *text, size_t len)
{
	if (len > s->max_bytes)
		return UINT32_MAX;
	char *t = malloc(len + 1);
	if (!t)
		nomem();
	memcpy(t, text, len);
	t[len] = '\0';
	Llamad__Tokenize tk = LLAMAD__TOKENIZE__INIT;
	tk.text = t;
	tk.has_add_bos = 1;
	tk.add_bos = 0;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_TOKENIZE;
	req.tokenize = &tk;
	Llamad__Response *r = cli_call(s->cli, &req, LLAMAD__RESPONSE__BODY_TOKENS);
	uint32_t n = r->tokens ? (uint32_t)r->tokens->n_tokens : 0;
	llamad__response__free_unpacked(r, NULL);
	free(t);
	return n;
}

/* End of the segment starting at text[i] (exclusive, separator included)
 * for a split level: 0 paragraphs, 1 lines, 2 sentences, 3 words. */
static size_t segment_end(const char *text, size_t len, size_t i, int level)
{
	for (size_t k = i; k < len; k++) {
		char c = text[k];
		switch (level) {
		case 0:
			if (c == '\n' && k + 1 < len && text[k + 1] == '\n') {
				k += 2;
				while (k < len && text[k] == '\n')
					k++;
				return k;
			}
			break;
		case 1:
			if (c == '\n')
				return k + 1;
			break;
		case 2:
			if ((c == '.' || c == '!' || c == '?') && k + 1 < len &&
			    (text[k + 1] == ' ' || text[k + 1] == '\t'))
				return k + 2;
			break;
		default:
			if (c == ' ' || c == '\t')
				return k + 1;
			break;
		}
	}
	return len;
}

/* A cut at about byte `want` of text[0..len) (0 < want < len) that does not
 * split a UTF-8 character; never 0 or len. */
static size_t utf8_cut(const char *text, size_t len, size_t want)
{
	size_t m = want;
	while (m > 0 && ((unsigned char)text[m] & 0xc0) == 0x80)
		m--;
	if (m == 0) {
		m = 1;
		while (m < len && ((unsigned char)text[m] & 0xc0) == 0x80)
			m++;
	}
	return m;
}

/* Cut text[off..off+len) (of base) into pieces of at most s->limit tokens,
 * appended in order to out. ntok is the span's token count if known
 * (UINT32_MAX: unknown or too large). */
static void split_span(struct summ *s, const char *base, size_t off, size_t len,
		       int level, struct pieces *out)
{
	if (len == 0)
		return;
	if (level >= 4) {
		/* No boundary left: cut by bytes, in proportion to the tokens. */
		uint32_t n = count_tokens(s, base + off, len);
		if ((n != UINT32_MAX && n <= s->limit) || len <= 1) {
			pieces_push(out, off, len, n == UINT32_MAX ? s->limit : n);
			return;
		}
		size_t want = n == UINT32_MAX ? len / 2
			: (size_t)((double)len * s->limit * 0.9 / n);
		if (want == 0)
			want = 1;
		size_t m = utf8_cut(base + off, len, want < len ? want : len / 2);
		split_span(s, base, off, m, 4, out);
		split_span(s, base, off + m, len - m, 4, out);
		return;
	}
	const char *text = base + off;
	size_t i = 0;
	while (i < len) {
		size_t e = segment_end(text, len, i, level);
		if (i == 0 && e == len) {   /* no separator of this level */
			split_span(s, base, off, len, level + 1, out);
			return;
		}
		uint32_t n = count_tokens(s, text + i, e - i);
		if (n != UINT32_MAX && n <= s->limit)
			pieces_push(out, off + i, e - i, n);
		else
			split_span(s, base, off + i, e - i, level + 1, out);
		i = e;
	}
}

/* Strip leading and trailing white space in place; returns the new start. */
static char *trim(char *t, size_t *len)
{
	size_t a = 0, b = *len;
	while (a < b && strchr(" \t\r\n", t[a]))
		a++;
	while (b > a && strchr(" \t\r\n", t[b - 1]))
		b--;
	*len = b - a;
	memmove(t, t + a, *len);
	t[*len] = '\0';
	return t;
}

/* The chat template new sessions get from the daemon (a throw-away
 * session opened to see it), llama2 when that is raw. */
static Llamad__Template default_chat_template(struct cli *cli)
{
	char eph[64];
	cli_ephemeral_name(eph, sizeof(eph));
	struct open_opts o = { .ephemeral = true, .create_only = true };
	Llamad__Response *r = cli_open_session(cli, eph, &o, false);
	Llamad__Template t = r->session && r->session->has_template_ ? r->session->template_
								      : LLAMAD__TEMPLATE__TEMPLATE_RAW;
	llamad__response__free_unpacked(r, NULL);
	cli_drop_session(cli, eph, true);
	return t == LLAMAD__TEMPLATE__TEMPLATE_LLAMA3 ? t : LLAMAD__TEMPLATE__TEMPLATE_LLAMA2;
}

/* The user turn that asks for a summary of text[0..len) (malloc'd). */
static char *sum_prompt(const char *text, size_t len)
{
	size_t pl = strlen(SUM_PREFIX);
	char *prompt = malloc(pl + len + 1);
	if (!prompt)
		nomem();
	memcpy(prompt, SUM_PREFIX, pl);
	memcpy(prompt + pl, text, len);
	prompt[pl + len] = '\0';
	return prompt;
}

/* Summarize text[0..len) in session (NULL: a fresh throw-away one). The
 * answer streams to echo when not NULL, and as JSON token events when
 * events; res gets the collected text and the Done reply. Exits 1 on a
 * daemon error. */
static void summarize_one(struct summ *s, const char *text, size_t len,
			  const char *session, FILE *echo, bool events, struct gen_result *res)
{
	struct cli *cli = s->cli;
	char eph[64];
	if (!session) {
		cli_ephemeral_name(eph, sizeof(eph));
		struct open_opts o = { .system = SUM_SYSTEM, .tmpl = s->tmpl, .ephemeral = true,
				       .create_only = true };
		llamad__response__free_unpacked(cli_open_session(cli, eph, &o, false), NULL);
	}
	char *prompt = sum_prompt(text, len);
	struct gen_req req = {
		.session = session ? session : eph,
		.prompt = prompt,
		.role = LLAMAD__ROLE__ROLE_USER,
		.opts = &s->g,
		.echo = echo,
		.events = events,
		.collect = true,
	};
	cli_generate(cli, &req, res);
	free(prompt);
	if (res->term->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		if (echo && res->last)
			fputc('\n', echo);
		cli_flush_stdout();
		cli_print_error(res->term);
		gen_result_done(res);
		exit(EXIT_DAEMON);
	}
	cli_expect(res->term, LLAMAD__RESPONSE__BODY_DONE);
	if (!session)
		cli_drop_session(cli, eph, true);
	s->parts++;
}

/* Part `part` of `parts` of a round is summarized (in_tok tokens to
 * out_tok): a line on stderr with -v or when stderr is a terminal, and
 * with --json the line
 * {"event":"progress","round","part","parts","input_tokens","summary_tokens"}. */
static void progress(struct summ *s, int round, size_t part, size_t parts, uint32_t in_tok,
		     uint32_t out_tok)
{
	if (s->cli->verbose || isatty(STDERR_FILENO))   /* long work: say how far it is */
		fprintf(stderr, "llamactl: round %d: part %zu/%zu: %u tokens -> %u\n", round, part,
			parts, in_tok, out_tok);
	if (!s->cli->json)
		return;
	pbjson_line("{s:s, s:u, s:u, s:u, s:u, s:u}", "event", "progress", "round",
		    (uint64_t)round, "part", (uint64_t)part, "parts", (uint64_t)parts,
		    "input_tokens", (uint64_t)in_tok, "summary_tokens", (uint64_t)out_tok);
	cli_flush_stdout();
}

static void send_or_die(struct cli *cli, Llamad__Request *rq, uint64_t *id)
{
	int rc = conn_send(&cli->conn, rq, id);
	if (rc)
		cli_die_conn(cli, rc);
}

/* Send part p's three requests: open a throw-away session, summarize
 * text[0..len) (ntok tokens) in it, drop it. Its summary may take half its
 * tokens at most (and the budget), so that every round at least halves the
 * text: near the end, two parts' summaries of a full budget each would
 * make the next round's text as long as this one's, forever. */
static void start_part(struct summ *s, struct part_run *p, size_t chunk, const char *text,
		       size_t len, uint32_t ntok)
{
	memset(p, 0, sizeof(*p));
	p->chunk = chunk;
	cli_ephemeral_name(p->name, sizeof(p->name));
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = p->name;
	o.system = SUM_SYSTEM;
	PB_SET(&o, template_, s->tmpl);
	PB_SET(&o, ephemeral, 1);
	PB_SET(&o, create_only, 1);
	Llamad__Request rq = LLAMAD__REQUEST__INIT;
	rq.op_case = LLAMAD__REQUEST__OP_OPEN;
	rq.open = &o;
	send_or_die(s->cli, &rq, &p->open_id);

	p->prompt = sum_prompt(text, len);
	struct gen_opts half = s->g;
	if (half.max_tokens > ntok / 2)
		half.max_tokens = ntok / 2 ? ntok / 2 : 1;
	struct gen_req g = { .session = p->name, .prompt = p->prompt, .role = LLAMAD__ROLE__ROLE_USER,
			     .opts = &half };
	Llamad__Generate gen;
	cli_generate_msg(&g, &gen);
	Llamad__Request rg = LLAMAD__REQUEST__INIT;
	rg.op_case = LLAMAD__REQUEST__OP_GENERATE;
	rg.generate = &gen;
	send_or_die(s->cli, &rg, &p->gen_id);

	Llamad__Drop d = LLAMAD__DROP__INIT;
	d.session = p->name;
	Llamad__Request rd = LLAMAD__REQUEST__INIT;
	rd.op_case = LLAMAD__REQUEST__OP_DROP;
	rd.drop = &d;
	send_or_die(s->cli, &rd, NULL);
}

/* An error reply to a part: said as any daemon error, and the end. */
static noreturn void part_failed(Llamad__Response *r)
{
	cli_flush_stdout();
	cli_print_error(r);
	exit(EXIT_DAEMON);
}

/* Summarize every chunk of text, s->parallel at a time: sums[i] gets
 * chunk i's summary (trimmed, malloc'd), *out_tok the tokens generated. */
static void run_parts(struct summ *s, const char *text, const struct pieces *chunks, int round,
		      char **sums, uint64_t *out_tok)
{
	struct cli *cli = s->cli;
	struct part_run run[SUM_PARALLEL];
	memset(run, 0, sizeof(run));
	size_t next = 0, done = 0, said = 0;
	/* each part's summary tokens, for progress said in the parts' order
	 * (they end in any order; the lines must not depend on it) */
	uint32_t *gen_toks = calloc(chunks->n ? chunks->n : 1, sizeof(*gen_toks));
	if (!gen_toks)
		nomem();
	while (done < chunks->n) {
		/* the first part alone: the template's start it computes is
		 * then shared by every other (prefix sharing), not computed by
		 * several at once, and llamad's counts do not depend on timing */
		unsigned width = done ? s->parallel : 1;
		for (unsigned k = 0; k < width && next < chunks->n; k++)
			if (!run[k].gen_id) {
				start_part(s, &run[k], next, text + chunks->v[next].off,
					   chunks->v[next].len, chunks->v[next].ntok);
				next++;
			}
		Llamad__Response *r = NULL;
		int rc = conn_next(&cli->conn, &r);
		if (rc)
			cli_die_conn(cli, rc);
		if ((!r->has_id || r->id == 0) && r->body_case == LLAMAD__RESPONSE__BODY_ERROR)
			part_failed(r);   /* a frame the daemon could not read */
		struct part_run *p = NULL;
		bool gen = false;
		for (unsigned k = 0; k < s->parallel && !p; k++)
			if (run[k].gen_id && (r->id == run[k].open_id || r->id == run[k].gen_id)) {
				p = &run[k];
				gen = r->id == run[k].gen_id;
			}
		if (!p || !gen) {   /* an Open's reply, or a Drop's */
			if (p && r->body_case == LLAMAD__RESPONSE__BODY_ERROR)
				part_failed(r);
			llamad__response__free_unpacked(r, NULL);
			continue;
		}
		if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN) {
			const char *t = r->token ? r->token->text : NULL;
			if (t && *t && gen_result_add(&p->res, t, strlen(t)))
				nomem();
			llamad__response__free_unpacked(r, NULL);
			continue;
		}
		if (r->body_case != LLAMAD__RESPONSE__BODY_DONE || !r->done)
			part_failed(r);
		size_t n = p->res.len;
		char *t = p->res.text ? trim(p->res.text, &n) : "";
		if (!(sums[p->chunk] = strdup(t)))
			nomem();
		gen_toks[p->chunk] = r->done->generated_tokens;
		*out_tok += r->done->generated_tokens;
		s->parts++;
		done++;
		for (; said < chunks->n && sums[said]; said++)
			progress(s, round, said + 1, chunks->n, chunks->v[said].ntok, gen_toks[said]);
		llamad__response__free_unpacked(r, NULL);
		free(p->prompt);
		gen_result_done(&p->res);
		p->gen_id = 0;
	}
	free(gen_toks);
}

/* One round: cut text into pieces, summarize each, return the joined
 * summaries (malloc'd, *out_len bytes); *in_tok is the text's tokens (the
 * sum of its pieces'), *out_tok the summaries' (the sum of what was
 * generated), *most the most tokens of a part. */
static char *summarize_round(struct summ *s, const char *text, size_t len, int round,
			     size_t *out_len, uint64_t *in_tok, uint64_t *out_tok, uint32_t *most)
{
	struct pieces pc = { 0 };
	split_span(s, text, 0, len, 0, &pc);

	/* Greedy packing of consecutive pieces into chunks of <= limit tokens
	 * and <= max_bytes (a request's text, when the context is unknown) */
	struct pieces chunks = { 0 };
	*in_tok = *out_tok = 0;
	*most = 0;
	for (size_t i = 0; i < pc.n; i++)
		*in_tok += pc.v[i].ntok;
	for (size_t i = 0; i < pc.n;) {
		size_t off = pc.v[i].off;
		uint64_t sum = pc.v[i].ntok;
		size_t k = i + 1;
		while (k < pc.n && sum + pc.v[k].ntok <= s->limit &&
		       pc.v[k].off + pc.v[k].len - off <= s->max_bytes) {
			sum += pc.v[k].ntok;
			k++;
		}
		/* pieces counted apart may make more tokens together (their
		 * joins, a tokenizer's leading space): the chunk is counted
		 * whole, and pieces go from its end until it fits */
		size_t end = pc.v[k - 1].off + pc.v[k - 1].len;
		uint32_t real = count_tokens(s, text + off, end - off);
		while (k > i + 1 && (real == UINT32_MAX || real > s->limit)) {
			uint64_t target = real == UINT32_MAX ? sum / 2 : sum * s->limit / real;
			do {
				k--;
				sum -= pc.v[k].ntok;
			} while (k > i + 1 && sum > target);
			end = pc.v[k - 1].off + pc.v[k - 1].len;
			real = count_tokens(s, text + off, end - off);
		}
		if (real != UINT32_MAX)
			sum = real;
		pieces_push(&chunks, off, end - off, (uint32_t)sum);
		if (sum > *most)
			*most = (uint32_t)sum;
		i = k;
	}
	free(pc.v);
	if (s->cli->verbose)
		fprintf(stderr, "llamactl: round %d: %zu parts of at most %u tokens\n",
			round, chunks.n, s->limit);

	char **sums = calloc(chunks.n ? chunks.n : 1, sizeof(*sums));
	if (!sums)
		nomem();
	run_parts(s, text, &chunks, round, sums, out_tok);
	char *out = NULL;
	size_t olen = 0;
	for (size_t i = 0; i < chunks.n; i++) {
		size_t n = strlen(sums[i]);
		char *o = realloc(out, olen + n + 3);
		if (!o)
			nomem();
		out = o;
		if (olen) {
			memcpy(out + olen, "\n\n", 2);
			olen += 2;
		}
		memcpy(out + olen, sums[i], n);
		olen += n;
		out[olen] = '\0';
		free(sums[i]);
	}
	free(sums);
	free(chunks.v);
	if (!out) {
		out = strdup("");
		if (!out)
			nomem();
	}
	*out_len = olen;
	return out;
}

/* The context length (0: not said) and the KV cache's tokens (0: not
 * said) from the daemon's Status. */
static uint32_t from_status(struct cli *cli, uint64_t *kv_tokens)
{
	Llamad__GetStatus gs = LLAMAD__GET_STATUS__INIT;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_STATUS;
	req.status = &gs;
	Llamad__Response *r = cli_call_any(cli, &req);
	uint32_t n = 0;
	*kv_tokens = 0;
	if (r->body_case == LLAMAD__RESPONSE__BODY_STATUS && r->status) {
		n = r->status->context_length;
		*kv_tokens = (uint64_t)r->status->kv_blocks_total * r->status->kv_block_tokens;
	}
	llamad__response__free_unpacked(r, NULL);
	return n;
}

static int cmd_summarize(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		CLI_COMMON_OPTS, CLI_SAMPLER_OPTS,
		{ "session", required_argument, NULL, 's' },
		{ 0 },
	};
	struct summ s;
	memset(&s, 0, sizeof(s));
	s.cli = cli;
	gen_opts_init(&s.g);
	const char *session = NULL;
	int o;
	while ((o = getopt_long(argc, argv, "hvn:s:", opts, NULL)) != -1) {
		if (o == 's')
			session = cli_want_session(cli, optarg);
		else
			cli_opt(cli, &s.g, o, optarg);
	}
	if (optind < argc)
		cli_usage_error(cli, "unexpected argument '%s' (the text comes on stdin)",
				argv[optind]);

	cli_connect(cli);   /* first: no daemon, no need to read stdin */
	size_t len;
	char *input = cli_read_all(STDIN_FILENO, &len);
	if (input[strspn(input, " \t\r\n")] == '\0') {
		free(input);
		cli_usage_error(cli, "nothing to summarize on stdin");
	}

	uint64_t kv_tokens;
	uint32_t ctx = from_status(cli, &kv_tokens);
	s.ctx = cli->conn.context_length ? cli->conn.context_length : ctx;
	/* parts at once: their sessions within a quarter of the KV cache */
	uint64_t fit = s.ctx && kv_tokens ? kv_tokens / 4 / s.ctx : 1;
	s.parallel = fit < 1 ? 1 : fit > SUM_PARALLEL ? SUM_PARALLEL : (unsigned)fit;
	/* a Tokenize's text must fit both a frame and the daemon's max_text */
	s.max_bytes = cli->conn.max_frame > 4096 ? cli->conn.max_frame - 1024 : 3072;
	if (cli->conn.max_text && s.max_bytes > cli->conn.max_text)
		s.max_bytes = cli->conn.max_text;

	if (s.g.has_max_tokens) {
		s.budget = s.g.max_tokens;
	} else {
		s.budget = SUM_DEFAULT_BUDGET;
		if (s.ctx && s.budget > s.ctx / 4)
			s.budget = s.ctx / 4 ? s.ctx / 4 : 1;
		s.g.has_max_tokens = true;
		s.g.max_tokens = s.budget;
	}
	/* the template's text around the text: Tokenize does not parse special
	 * tokens, so llama3's count as several (an overestimate, on the safe
	 * side) */
	s.tmpl = default_chat_template(cli);
	const char l2[] = "[INST] <<SYS>>\n" SUM_SYSTEM "\n<</SYS>>\n\n" SUM_PREFIX " [/INST]";
	const char l3[] = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
			  SUM_SYSTEM "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
			  SUM_PREFIX "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
	const char *skeleton = s.tmpl == LLAMAD__TEMPLATE__TEMPLATE_LLAMA3 ? l3 : l2;
	s.overhead = count_tokens(&s, skeleton, strlen(skeleton)) + SUM_MARGIN;

	if (s.ctx == 0) {
		s.limit = UINT32_MAX;   /* the daemon did not say: no splitting */
	} else {
		uint64_t fixed = (uint64_t)s.budget + s.overhead;
		if (fixed + 16 > s.ctx)
			cli_usage_error(cli, "--max-tokens %u leaves no room for the text "
					"(the context holds %u tokens)", s.budget, s.ctx);
		s.limit = (uint32_t)(s.ctx - fixed);
	}
	s.final_limit = s.limit;

	if (session) {
		struct open_opts o = { .system = SUM_SYSTEM, .tmpl = s.tmpl };
		Llamad__Response *r = cli_open_chat(cli, session, o);
		uint32_t have = r->session ? r->session->tokens : 0;
		llamad__response__free_unpacked(r, NULL);
		if (s.ctx) {
			if ((uint64_t)have + s.budget + s.overhead + 16 > s.ctx) {
				cli_error("local", 0, "session %s holds %u tokens: no room left "
					  "for a summary (context %u)", session, have, s.ctx);
				free(input);
				return EXIT_DAEMON;
			}
			s.final_limit = s.ctx - have - s.budget - s.overhead;
		}
	}

	/* Rounds until the text fits one final request. n is a count to
	 * compare with final_limit only: UINT32_MAX when the text is over
	 * one request's bytes (then surely over the context too); a round's
	 * progress is judged on the real counts of its parts and summaries. */
	char *text = input;
	size_t tlen = len;
	uint32_t n = count_tokens(&s, text, tlen);
	uint64_t n_input = n;
	if (cli->verbose && n == UINT32_MAX)
		fprintf(stderr, "llamactl: input %zu bytes, over one request's %zu: sent in "
			"pieces; context %u, summary budget %u, overhead %u\n", len, s.max_bytes,
			s.ctx, s.budget, s.overhead);
	else if (cli->verbose)
		fprintf(stderr, "llamactl: input %u tokens; context %u, summary budget %u, "
			"overhead %u\n", n, s.ctx, s.budget, s.overhead);
	int round = 0;
	while (n > s.final_limit) {
		if (++round > SUM_MAX_ROUNDS) {
			cli_error("local", 0, "the text does not get short enough in %d rounds",
				  SUM_MAX_ROUNDS);
			free(text);
			return EXIT_DAEMON;
		}
		size_t nlen;
		uint64_t in_tok, out_tok;
		uint32_t most;
		char *next = summarize_round(&s, text, tlen, round, &nlen, &in_tok, &out_tok, &most);
		if (round == 1 && n == UINT32_MAX)   /* the whole was too large to count */
			n_input = in_tok;
		if (out_tok >= in_tok) {
			/* each part of up to `most` tokens got a summary of up
			 * to budget: shorter summaries help, and leave room for
			 * longer parts; a budget of a third of what the template
			 * leaves makes every summary at most half its part */
			uint32_t fits = s.ctx > s.overhead ? (s.ctx - s.overhead) / 3 : most / 2;
			if (fits >= s.budget)
				fits = s.budget / 2;
			cli_error("local", 0, "round %d: the summaries (%llu tokens) are no shorter "
				  "than the text (%llu tokens in parts of up to %u); ask for "
				  "shorter summaries: --max-tokens %u or less (now %u)", round,
				  (unsigned long long)out_tok, (unsigned long long)in_tok, most,
				  fits ? fits : 1, s.budget);
			free(next);
			free(text);
			return EXIT_DAEMON;
		}
		if (cli->verbose || isatty(STDERR_FILENO))
			fprintf(stderr, "llamactl: round %d done: %llu tokens -> %llu\n", round,
				(unsigned long long)in_tok, (unsigned long long)out_tok);
		free(text);
		text = next;
		tlen = nlen;
		n = count_tokens(&s, text, tlen);
	}

	struct gen_result res;
	summarize_one(&s, text, tlen, session, cli->json ? NULL : stdout, cli->json, &res);
	if (cli->json) {
		size_t sl = res.len;
		char *sum = res.text ? trim(res.text, &sl) : "";
		/* text: as the token events gave it, untrimmed */
		pbjson_line("{s:s, s:s#, s:s#, s:s, s:u, s:u, s:u, M}", "event", "done", "summary",
			    sum, sl, "text", res.text ? res.text : "", res.len, "session", session,
			    "parts", (uint64_t)s.parts, "rounds", (uint64_t)round + 1,
			    "input_tokens", (uint64_t)n_input, &res.term->done->base);
	} else {
		fputc('\n', stdout);
	}
	cli_flush_stdout();
	cli_report_done(cli, res.term->done);
	gen_result_done(&res);
	free(text);
	return EXIT_OK;
}
