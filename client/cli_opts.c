/*
 * client/cli_opts.c — llamactl's options and arguments: the common and sampler options, numbers
 * checked, session names, the start of every command, text from an
 * argument or stdin (cli.h).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"
#include "util/file.h"

void gen_opts_init(struct gen_opts *g)
{
	memset(g, 0, sizeof(*g));
	Llamad__SamplerOptions init = LLAMAD__SAMPLER_OPTIONS__INIT;
	g->sampler = init;
}

uint64_t cli_parse_u64(const struct cli *cli, const char *what, const char *arg,
		       uint64_t min, uint64_t max)
{
	char *end;
	errno = 0;
	if (!arg || !*arg || *arg == '-' || *arg == '+')
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg ? arg : "");
	unsigned long long v = strtoull(arg, &end, 10);
	if (errno || *end)
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg);
	if (v < min || v > max)
		cli_usage_error(cli, "%s: %s is out of range [%llu, %llu]", what, arg,
				(unsigned long long)min, (unsigned long long)max);
	return v;
}

static int64_t parse_i32(const struct cli *cli, const char *what, const char *arg,
			 long min, long max)
{
	char *end;
	errno = 0;
	long v = strtol(arg, &end, 10);
	if (errno || end == arg || *end)
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg);
	if (v < min || v > max)
		cli_usage_error(cli, "%s: %s is out of range [%ld, %ld]", what, arg, min, max);
	return v;
}

static float parse_float(const struct cli *cli, const char *what, const char *arg,
			 double min, double max)
{
	char *end;
	errno = 0;
	double v = strtod(arg, &end);
	if (errno || end == arg || *end || !isfinite(v))
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg);
	if (v < min || v > max)
		cli_usage_error(cli, "%s: %s is out of range [%g, %g]", what, arg, min, max);
	return (float)v;
}

/* Returns true if o was a sampler option (and applies it). */
static bool sampler_opt(struct cli *cli, struct gen_opts *g, int o, const char *arg)
{
	Llamad__SamplerOptions *s = &g->sampler;
	switch (o) {
	case OPT_TEMP:
		s->has_temperature = 1;
		s->temperature = parse_float(cli, "--temperature", arg, 0, 100);
		return true;
	case OPT_TOPK:
		s->has_top_k = 1;
		s->top_k = (int32_t)parse_i32(cli, "--top-k", arg, 0, 1 << 30);
		return true;
	case OPT_TOPP:
		s->has_top_p = 1;
		s->top_p = parse_float(cli, "--top-p", arg, 1e-6, 1);
		return true;
	case OPT_MINP:
		s->has_min_p = 1;
		s->min_p = parse_float(cli, "--min-p", arg, 0, 0.999);
		return true;
	case OPT_REPEAT:
		s->has_repeat_penalty = 1;
		s->repeat_penalty = parse_float(cli, "--repeat-penalty", arg, 1e-3, 10);
		return true;
	case OPT_LASTN:
		s->has_repeat_last_n = 1;
		s->repeat_last_n = (int32_t)parse_i32(cli, "--repeat-last-n", arg, -1, 1 << 30);
		return true;
	case OPT_PRESENCE:
		s->has_presence_penalty = 1;
		s->presence_penalty = parse_float(cli, "--presence-penalty", arg, -10, 10);
		return true;
	case OPT_FREQ:
		s->has_frequency_penalty = 1;
		s->frequency_penalty = parse_float(cli, "--frequency-penalty", arg, -10, 10);
		return true;
	case OPT_SEED:
		s->has_seed = 1;
		s->seed = cli_parse_u64(cli, "--seed", arg, 0, UINT64_MAX);
		return true;
	case OPT_MAXTOK:
		g->has_max_tokens = true;
		g->max_tokens = (uint32_t)cli_parse_u64(cli, "--max-tokens", arg, 1, 1u << 20);
		return true;
	case OPT_STOP:
		if (!*arg)
			cli_usage_error(cli, "--stop: empty stop string");
		if (g->n_stop >= LLAMAD_MAX_STOPS)
			cli_usage_error(cli, "--stop: at most %d stop strings", LLAMAD_MAX_STOPS);
		g->stop[g->n_stop++] = (char *)arg;
		return true;
	}
	return false;
}

void cli_opt(struct cli *cli, struct gen_opts *g, int o, const char *arg)
{
	switch (o) {
	case 'h':
		cli_print_help(cli, stdout);
		cli_flush_stdout();
		exit(EXIT_OK);
	case 'v':
		cli->verbose = true;
		return;
	case OPT_JSON:
		cli->json = true;
		cli_errors_json();
		return;
	case OPT_SOCKET:
		if (!*arg)
			cli_usage_error(cli, "--socket: empty path");
		cli->socket = arg;   /* this path alone: no default candidates */
		for (; cli->n_candidates > 0; cli->n_candidates--)
			free(cli->candidates[cli->n_candidates - 1]);
		return;
	}
	if (g && sampler_opt(cli, g, o, arg))
		return;
	if (o == 's' && g) {
		g->session = cli_want_session(cli, arg);
		return;
	}
	if (o == OPT_POLICY && g) {
		g->policy = cli_parse_policy(cli, arg);
		return;
	}
	if (o == 'n' && g) {   /* -n is --max-tokens */
		sampler_opt(cli, g, OPT_MAXTOK, arg);
		return;
	}
	/* '?', ':' or an option this command does not take: getopt has
	 * already said what was wrong. */
	cli_bad_option(cli);
}

Llamad__ContextPolicy cli_parse_policy(const struct cli *cli, const char *arg)
{
	int v;
	if (cli_enum_value(&llamad__context_policy__descriptor, arg, &v) &&
	    v != LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT)
		return (Llamad__ContextPolicy)v;
	cli_usage_error(cli, "--context-policy: '%s' is not shift or error", arg);
}

void cli_want_args(const struct cli *cli, int argc, char **argv, int min, int max)
{
	int n = argc - optind;
	if (n > max)
		cli_usage_error(cli, "unexpected argument '%s'%s", argv[optind + max],
				max == 1 ? " (quote text that has spaces)" : "");
	if (n < min)
		cli_usage_error(cli, "missing argument");
}

const char *cli_want_session(const struct cli *cli, const char *name)
{
	if (!llamad_session_id_ok(name))
		cli_usage_error(cli, "'%s' is not a session name: " LLAMAD_SESSION_ID_RULE, name);
	return name;
}

void cli_parse_common(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = { CLI_COMMON_OPTS, { 0 } };
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1)
		cli_opt(cli, NULL, o, optarg);
}

void cli_begin(struct cli *cli, int argc, char **argv, int min, int max)
{
	cli_parse_common(cli, argc, argv);
	cli_want_args(cli, argc, argv, min, max);
	cli_connect(cli);
}

const char *cli_begin_session(struct cli *cli, int argc, char **argv)
{
	cli_parse_common(cli, argc, argv);
	cli_want_args(cli, argc, argv, 1, 1);
	cli_want_session(cli, argv[optind]);
	cli_connect(cli);
	return argv[optind];
}

char *cli_text_arg(const char *arg)
{
	if (arg && strcmp(arg, "-") != 0) {
		char *s = strdup(arg);
		if (!s)
			cli_die_local("out of memory");
		return s;
	}
	size_t n;
	return cli_read_all(STDIN_FILENO, &n);
}

char *cli_read_all(int fd, size_t *len)
{
	char *buf = NULL;
	int rc = file_read_fd(fd, (size_t)1 << 40, &buf, len);
	if (rc == -ENOMEM)
		cli_die_local("out of memory reading stdin");
	if (rc < 0)
		cli_die_local("cannot read stdin: %s", strerror(-rc));
	return buf;
}
