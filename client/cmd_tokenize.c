/*
 * client/cmd_tokenize.c — `llamactl tokenize`: the tokens of a text.
 */
#include <stdio.h>
#include <stdlib.h>

#include "client/cli.h"
#include "util/utf8.h"

static int cmd_tokenize(struct cli *cli, int argc, char **argv);

const struct command cmd_tokenize_entry = {
	.name = "tokenize",
	.args = "[--bos] [TEXT | -]",
	.summary = "show the tokens of a text",
	.help =
"Tokenize TEXT (or stdin, with \"-\" or no TEXT) with the daemon's tokenizer;\n"
"print one token a line: its id, the text it stands for in quotes (\\n, \\t,\n"
"\\\" and \\\\ escaped, a byte of a character split between tokens as \\xAB), and\n"
"the vocabulary's piece (a control token has no text: only its piece).\n"
"With --json: {\"tokens\":[..],\"pieces\":[..],\"texts\":[..]}.\n"
"\n"
"      --bos               add the beginning-of-sequence token\n",
	.run = cmd_tokenize,
};

/* A token piece on one line: control bytes escaped, the rest as is. */
static void print_piece(const char *p)
{
	for (; p && *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '\n')
			fputs("\\n", stdout);
		else if (c == '\t')
			fputs("\\t", stdout);
		else if (c == '\r')
			fputs("\\r", stdout);
		else if (c == '\\')
			fputs("\\\\", stdout);
		else if (c < 0x20 || c == 0x7f)
			printf("\\x%02x", c);
		else
			fputc(c, stdout);
	}
}

/* The length of the UTF-8 character at p[0, n) if it is a whole, valid
 * one, else 0. */
static size_t utf8_char(const unsigned char *p, size_t n)
{
	size_t k = (size_t)utf8_seq_len(p[0]);
	return k && k <= n && utf8_valid((const char *)p, k) ? k : 0;
}

/* A token's text in quotes on one line: control bytes, quotes and
 * backslashes escaped, bytes of a split character as \xAB. */
static void print_text(const ProtobufCBinaryData *t)
{
	const unsigned char *p = t->data;
	fputc('"', stdout);
	for (size_t i = 0; i < t->len;) {
		size_t k = utf8_char(p + i, t->len - i);
		if (k > 1) {
			fwrite(p + i, 1, k, stdout);
			i += k;
			continue;
		}
		if (k == 0)
			printf("\\x%02x", p[i]);
		else if (p[i] == '"')
			fputs("\\\"", stdout);
		else
			print_piece((const char[]){ (char)p[i], 0 });
		i++;
	}
	fputc('"', stdout);
}

static int cmd_tokenize(struct cli *cli, int argc, char **argv)
{
	enum { O_BOS = OPT_CMD };
	static const struct option opts[] = {
		CLI_COMMON_OPTS,
		{ "bos", no_argument, NULL, O_BOS },
		{ 0 },
	};
	bool bos = false;
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1) {
		if (o == O_BOS)
			bos = true;
		else
			cli_opt(cli, NULL, o, optarg);
	}
	cli_want_args(cli, argc, argv, 0, 1);
	cli_connect(cli);
	char *text = cli_text_arg(optind < argc ? argv[optind] : NULL);
	Llamad__Tokenize tk = LLAMAD__TOKENIZE__INIT;
	tk.text = text;
	tk.has_add_bos = 1;
	tk.add_bos = bos;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_TOKENIZE;
	req.tokenize = &tk;
	Llamad__Response *r = cli_call(cli, &req, LLAMAD__RESPONSE__BODY_TOKENS);
	const Llamad__Tokens *t = r->tokens;
	size_t n = t ? t->n_tokens : 0;
	if (cli->json) {
		Llamad__Tokens none = LLAMAD__TOKENS__INIT;
		cli_json_message(t ? &t->base : &none.base);
	} else {
		for (size_t i = 0; i < n; i++) {
			printf("%6u  ", t->tokens[i]);
			if (i < t->n_texts && t->texts[i].len > 0) {
				print_text(&t->texts[i]);
				fputs("  ", stdout);
			}
			print_piece(i < t->n_pieces ? t->pieces[i] : NULL);
			fputc('\n', stdout);
		}
	}
	cli_flush_stdout();
	if (cli->verbose)
		fprintf(stderr, "llamactl: %zu tokens\n", n);
	llamad__response__free_unpacked(r, NULL);
	free(text);
	return EXIT_OK;
}
