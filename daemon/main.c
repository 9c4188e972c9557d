/*
 * daemon/main.c — llamad's command line.
 *
 * This version runs one-shot generations (--prompt). Serving sessions over a
 * Unix socket is the next step of the project and is not implemented yet.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "daemon/oneshot.h"

#define LLAMAD_VERSION "0.1.0"

static void usage(FILE *f)
{
	fputs(
"usage: llamad --model PATH [--tokenizer PATH] --prompt TEXT [options]\n"
"\n"
"One-shot generation: load the model, print the completion of the prompt to\n"
"stdout, exit. (Serving sessions over a socket is not implemented yet.)\n"
"\n"
"Model:\n"
"  -m, --model PATH        llama2.c .bin checkpoint, or a Hugging Face folder\n"
"                          (config.json + *.safetensors, f32/f16/bf16)\n"
"      --tokenizer PATH    SentencePiece tokenizer.model (default: the\n"
"                          tokenizer.model in the model's folder)\n"
"  -t, --threads N         CPU worker threads (default: all online cores)\n"
"\n"
"Generation:\n"
"  -p, --prompt TEXT       prompt text; \"-\" reads it from stdin\n"
"      --template NAME     raw (default: BOS + text) or llama2 (chat format)\n"
"      --system TEXT       system prompt (llama2 template only)\n"
"  -n, --max-tokens N      generate at most N tokens (default 256)\n"
"      --echo              print the prompt before the completion\n"
"      --stop TEXT         stop before TEXT (repeatable, up to 16)\n"
"  -v, --verbose           print the model and timings to stderr\n"
"\n"
"Sampling (temperature 0 = greedy):\n"
"      --temperature T     default 0.8\n"
"      --top-k K           default 40 (0: off)\n"
"      --top-p P           default 0.95 (1: off)\n"
"      --min-p P           default 0.05 (0: off)\n"
"      --repeat-penalty R  default 1.0 (off)\n"
"      --repeat-last-n N   penalty window, default 64 (-1: all)\n"
"      --presence-penalty X, --frequency-penalty X   default 0\n"
"      --seed S            default: random (printed with --verbose)\n"
"\n"
"  -h, --help              this text\n"
"      --version           print the version\n"
"\n"
"Exit status: 0 ok, 1 runtime error (e.g. model cannot be loaded), 2 usage.\n",
	f);
}

enum {
	OPT_TOKENIZER = 256, OPT_TEMPLATE, OPT_SYSTEM, OPT_ECHO, OPT_STOP, OPT_TEMP,
	OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_LASTN, OPT_PRESENCE, OPT_FREQ,
	OPT_SEED, OPT_VERSION,
};

static const struct option long_opts[] = {
	{ "model", required_argument, NULL, 'm' },
	{ "tokenizer", required_argument, NULL, OPT_TOKENIZER },
	{ "threads", required_argument, NULL, 't' },
	{ "prompt", required_argument, NULL, 'p' },
	{ "template", required_argument, NULL, OPT_TEMPLATE },
	{ "system", required_argument, NULL, OPT_SYSTEM },
	{ "max-tokens", required_argument, NULL, 'n' },
	{ "echo", no_argument, NULL, OPT_ECHO },
	{ "stop", required_argument, NULL, OPT_STOP },
	{ "verbose", no_argument, NULL, 'v' },
	{ "temperature", required_argument, NULL, OPT_TEMP },
	{ "top-k", required_argument, NULL, OPT_TOPK },
	{ "top-p", required_argument, NULL, OPT_TOPP },
	{ "min-p", required_argument, NULL, OPT_MINP },
	{ "repeat-penalty", required_argument, NULL, OPT_REPEAT },
	{ "repeat-last-n", required_argument, NULL, OPT_LASTN },
	{ "presence-penalty", required_argument, NULL, OPT_PRESENCE },
	{ "frequency-penalty", required_argument, NULL, OPT_FREQ },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ NULL, 0, NULL, 0 },
};

static int bad_value(const char *opt, const char *val, const char *why)
{
	fprintf(stderr, "llamad: --%s %s: %s\n", opt, val, why);
	return 2;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		char why[96];
		snprintf(why, sizeof(why), "expected an integer in [%ld, %ld]", lo, hi);
		return bad_value(opt, s, why);
	}
	*out = v;
	return 0;
}

static int parse_float(const char *opt, const char *s, float *out)
{
	char *end;
	errno = 0;
	float v = strtof(s, &end);
	if (errno || end == s || *end || !isfinite(v))
		return bad_value(opt, s, "expected a number");
	*out = v;
	return 0;
}

static char *read_stdin(void)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t k = fread(buf + n, 1, cap - n - 1, stdin);
		n += k;
		if (k == 0)
			break;
		if (cap - n - 1 == 0) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb) {
				free(buf);
				return NULL;
			}
			buf = nb;
		}
	}
	if (buf)
		buf[n] = 0;
	return buf;
}

int main(int argc, char **argv)
{
	const char *model_path = NULL, *tok_path = NULL;
	static const char *stops[16];
	struct oneshot_opts o = { 0 };
	o.max_tokens = 256;
	o.tmpl = CHAT_TEMPLATE_RAW;
	o.stops = stops;
	sampler_params_default(&o.sp);
	int seed_set = 0, c, rc;
	long v;
	while ((c = getopt_long(argc, argv, "m:t:p:n:vh", long_opts, NULL)) != -1) {
		const char *name = NULL;
		for (const struct option *lo = long_opts; lo->name; lo++)
			if (lo->val == c)
				name = lo->name;
		switch (c) {
		case 'm': model_path = optarg; break;
		case OPT_TOKENIZER: tok_path = optarg; break;
		case 't':
			if ((rc = parse_int(name, optarg, 1, 1024, &v)))
				return rc;
			o.threads = (int)v;
			break;
		case 'p': o.prompt = optarg; break;
		case OPT_TEMPLATE:
			if (!strcmp(optarg, "raw"))
				o.tmpl = CHAT_TEMPLATE_RAW;
			else if (!strcmp(optarg, "llama2"))
				o.tmpl = CHAT_TEMPLATE_LLAMA2;
			else
				return bad_value(name, optarg, "expected raw or llama2");
			break;
		case OPT_SYSTEM: o.system = optarg; break;
		case 'n':
			if ((rc = parse_int(name, optarg, 1, INT_MAX / 2, &v)))
				return rc;
			o.max_tokens = (int)v;
			break;
		case OPT_ECHO: o.echo = 1; break;
		case OPT_STOP:
			if (o.n_stops == 16)
				return bad_value(name, optarg, "at most 16 stop strings");
			stops[o.n_stops++] = optarg;
			break;
		case 'v': o.verbose = 1; break;
		case OPT_TEMP: if ((rc = parse_float(name, optarg, &o.sp.temperature))) return rc; break;
		case OPT_TOPK:
			if ((rc = parse_int(name, optarg, 0, INT_MAX, &v)))
				return rc;
			o.sp.top_k = (int)v;
			break;
		case OPT_TOPP: if ((rc = parse_float(name, optarg, &o.sp.top_p))) return rc; break;
		case OPT_MINP: if ((rc = parse_float(name, optarg, &o.sp.min_p))) return rc; break;
		case OPT_REPEAT: if ((rc = parse_float(name, optarg, &o.sp.repeat_penalty))) return rc; break;
		case OPT_LASTN:
			if ((rc = parse_int(name, optarg, -1, INT_MAX, &v)))
				return rc;
			o.sp.penalty_last_n = (int)v;
			break;
		case OPT_PRESENCE: if ((rc = parse_float(name, optarg, &o.sp.presence_penalty))) return rc; break;
		case OPT_FREQ: if ((rc = parse_float(name, optarg, &o.sp.frequency_penalty))) return rc; break;
		case OPT_SEED: {
			char *end;
			errno = 0;
			unsigned long long s = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-')
				return bad_value(name, optarg, "expected an unsigned integer");
			o.sp.seed = s;
			seed_set = 1;
			break;
		}
		case 'h': usage(stdout); return 0;
		case OPT_VERSION: printf("llamad %s\n", LLAMAD_VERSION); return 0;
		default:
			fprintf(stderr, "Try 'llamad --help'.\n");
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "llamad: unexpected argument '%s'\nTry 'llamad --help'.\n", argv[optind]);
		return 2;
	}
	if (!model_path) {
		fprintf(stderr, "llamad: --model PATH is required\nTry 'llamad --help'.\n");
		return 2;
	}
	if (!o.prompt) {
		fprintf(stderr, "llamad: --prompt is required: this version only runs one-shot "
			"generations (serving is not implemented yet)\n");
		return 2;
	}
	if (o.system && o.tmpl != CHAT_TEMPLATE_LLAMA2) {
		fprintf(stderr, "llamad: --system needs --template llama2\n");
		return 2;
	}
	const char *why = sampler_params_check(&o.sp);
	if (why) {
		fprintf(stderr, "llamad: bad sampling options: %s\n", why);
		return 2;
	}
	if (!seed_set && getrandom(&o.sp.seed, sizeof(o.sp.seed), 0) != sizeof(o.sp.seed))
		o.sp.seed = (uint64_t)time(NULL);
	char *stdin_prompt = NULL;
	if (!strcmp(o.prompt, "-")) {
		if (!(stdin_prompt = read_stdin())) {
			fprintf(stderr, "llamad: cannot read the prompt from stdin\n");
			return 1;
		}
		o.prompt = stdin_prompt;
	}
	char *cause = NULL;
	struct model *m = model_load(model_path, tok_path, &cause);
	if (!m) {
		fprintf(stderr, "llamad: %s\n", cause ? cause : "cannot load the model");
		free(cause);
		free(stdin_prompt);
		return 1;
	}
	if (o.verbose) {
		char desc[512];
		model_describe(m, desc, sizeof(desc));
		fprintf(stderr, "llamad: %s\nllamad: seed %llu\n", desc,
			(unsigned long long)o.sp.seed);
	}
	rc = oneshot_run(m, &o, stdout);
	model_free(m);
	free(stdin_prompt);
	return rc;
}
