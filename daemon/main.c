/*
 * daemon/main.c — llamad's command line: serve (the default) or run one
 * generation (--prompt) and exit.
 *
 * Every setting of llamad.conf(5) is also a flag: `--kv-memory 1G` sets
 * kv_memory. The file given with --config is read first; flags override it.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/log.h"
#include "daemon/oneshot.h"
#include "daemon/server.h"
#include "daemon/version.h"
#include "proto/limits.h"
#include "session/session.h"

static void usage(FILE *f)
{
	fputs(
"usage: llamad [--config FILE] --model PATH [options]              serve sessions\n"
"       llamad --model PATH --prompt TEXT [options]                one generation\n"
"\n"
"Serves Llama-family models to local programs over a Unix socket (see\n"
"llamactl(1), llamad-protocol(7)). With --prompt, prints one completion to\n"
"stdout and exits instead.\n"
"\n"
"General:\n"
"  -c, --config FILE        read settings from FILE first (llamad.conf(5))\n"
"      --print-config       print the effective settings and exit\n"
"  -h, --help               this text\n"
"      --version            print the version\n"
"\n"
"Settings (also config keys; [restart]: not changed by SIGHUP):\n", f);
	config_help(f);
	fputs(
"  (-m is --model, -t is --threads, -n is --max-tokens)\n"
"\n"
"One-shot generation:\n"
"  -p, --prompt TEXT        generate a completion of TEXT (\"-\": read stdin)\n"
"      --system TEXT        system prompt (with --template llama2)\n"
"      --echo               print the prompt before the completion\n"
"      --stop TEXT          stop before TEXT (repeatable, up to " LLAMAD_STR(LLAMAD_MAX_STOPS) ")\n"
"      --seed S             sampler seed (default: random)\n"
"  -v, --verbose            print the model, seed and timings to stderr\n"
"  One-shot uses --template raw unless told otherwise.\n"
"\n"
"Exit status: 0 ok, 1 run-time error (model, socket, ...), 2 usage.\n", f);
}

static int bad_value(const char *opt, const char *val, const char *why)
{
	fprintf(stderr, "llamad: --%s %s: %s\n", opt, val, why);
	return 2;
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
	struct config cfg;
	config_defaults(&cfg);
	static const char *stops[LLAMAD_MAX_STOPS];
	struct oneshot_opts o = { 0 };
	o.stops = stops;
	const char *config_path = NULL;
	int seed_set = 0, tmpl_set = 0, print_config = 0;
	uint64_t seed = 0;
	char *cause = NULL;
	int rc;

	/* the config file first, wherever --config appears */
	for (int i = 1; i < argc; i++) {
		if ((!strcmp(argv[i], "--config") || !strcmp(argv[i], "-c")) && i + 1 < argc)
			config_path = argv[++i];
		else if (!strncmp(argv[i], "--config=", 9))
			config_path = argv[i] + 9;
	}
	if (config_path && config_load(&cfg, config_path, 0, &cause) != 0) {
		fprintf(stderr, "llamad: %s\n", cause ? cause : config_path);
		free(cause);
		config_done(&cfg);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		char name[64];
		const char *val = NULL;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			config_done(&cfg);
			return 0;
		}
		if (!strcmp(a, "--version")) {
			printf("llamad %s\n", LLAMAD_VERSION);
			config_done(&cfg);
			return 0;
		}
		if (a[0] != '-' || !a[1]) {
			fprintf(stderr, "llamad: unexpected argument '%s'\nTry 'llamad --help'.\n", a);
			config_done(&cfg);
			return 2;
		}
		if (a[1] != '-') {  /* short options */
			static const char *const shorts[][2] = {
				{ "-m", "model" }, { "-t", "threads" }, { "-p", "prompt" },
				{ "-n", "max-tokens" }, { "-v", "verbose" }, { "-c", "config" },
			};
			const char *longname = NULL;
			for (size_t k = 0; k < sizeof(shorts) / sizeof(shorts[0]); k++)
				if (!strcmp(a, shorts[k][0]))
					longname = shorts[k][1];
			if (!longname) {
				fprintf(stderr, "llamad: unknown option '%s'\nTry 'llamad --help'.\n", a);
				config_done(&cfg);
				return 2;
			}
			snprintf(name, sizeof(name), "%s", longname);
		} else {
			const char *eq = strchr(a + 2, '=');
			size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
			if (n >= sizeof(name))
				n = sizeof(name) - 1;
			memcpy(name, a + 2, n);
			name[n] = 0;
			if (eq)
				val = eq + 1;
		}
		int noarg = !strcmp(name, "echo") || !strcmp(name, "verbose") ||
			    !strcmp(name, "print-config");
		if (!noarg && !val) {
			if (i + 1 >= argc) {
				fprintf(stderr, "llamad: --%s needs a value\n", name);
				config_done(&cfg);
				return 2;
			}
			val = argv[++i];
		}
		rc = 0;
		if (!strcmp(name, "echo"))
			o.echo = 1;
		else if (!strcmp(name, "verbose"))
			o.verbose = 1;
		else if (!strcmp(name, "print-config"))
			print_config = 1;
		else if (!strcmp(name, "config"))
			;  /* read above */
		else if (!strcmp(name, "prompt"))
			o.prompt = val;
		else if (!strcmp(name, "system"))
			o.system = val;
		else if (!strcmp(name, "stop")) {
			if (o.n_stops == LLAMAD_MAX_STOPS)
				rc = bad_value(name, val,
					       "at most " LLAMAD_STR(LLAMAD_MAX_STOPS) " stop strings");
			else
				stops[o.n_stops++] = val;
		} else if (!strcmp(name, "seed")) {
			char *end;
			errno = 0;
			unsigned long long sd = strtoull(val, &end, 10);
			if (errno || end == val || *end || val[0] == '-')
				rc = bad_value(name, val, "expected an unsigned integer");
			seed = sd;
			seed_set = 1;
		} else {
			const char *why = NULL;
			int r = config_set(&cfg, name, val, 0, &why);
			if (r == -ENOENT) {
				fprintf(stderr, "llamad: unknown option '--%s'\nTry 'llamad --help'.\n",
					name);
				rc = 2;
			} else if (r < 0) {
				rc = bad_value(name, val, why);
			}
			if (!strcmp(name, "template"))
				tmpl_set = 1;
		}
		if (rc) {
			config_done(&cfg);
			return rc;
		}
	}
	if (print_config) {
		config_dump(&cfg, stdout);
		config_done(&cfg);
		return 0;
	}
	if (!cfg.model) {
		fprintf(stderr, "llamad: no model: give --model PATH or model = PATH in the "
			"config file\nTry 'llamad --help'.\n");
		config_done(&cfg);
		return 2;
	}
	log_set_level(cfg.log_level);
	if (getenv("JOURNAL_STREAM"))
		log_set_journal(1);

	if (o.prompt) {
		o.threads = cfg.threads;
		o.device = cfg.device;
		o.gpu_weights = cfg.gpu_weights;
		o.max_tokens = cfg.max_tokens;
		o.tmpl = tmpl_set && cfg.tmpl == SESS_TMPL_LLAMA2 ? CHAT_TEMPLATE_LLAMA2
								   : CHAT_TEMPLATE_RAW;
		o.sp.temperature = cfg.temperature;
		o.sp.top_k = cfg.top_k;
		o.sp.top_p = cfg.top_p;
		o.sp.min_p = cfg.min_p;
		o.sp.repeat_penalty = cfg.repeat_penalty;
		o.sp.penalty_last_n = cfg.repeat_last_n;
		o.sp.presence_penalty = cfg.presence_penalty;
		o.sp.frequency_penalty = cfg.frequency_penalty;
		if (o.system && o.tmpl != CHAT_TEMPLATE_LLAMA2) {
			fprintf(stderr, "llamad: --system needs --template llama2\n");
			config_done(&cfg);
			return 2;
		}
		if (seed_set)
			o.sp.seed = seed;
		else if (getrandom(&o.sp.seed, sizeof(o.sp.seed), 0) != sizeof(o.sp.seed))
			o.sp.seed = (uint64_t)time(NULL);
		char *stdin_prompt = NULL;
		if (!strcmp(o.prompt, "-")) {
			if (!(stdin_prompt = read_stdin())) {
				fprintf(stderr, "llamad: cannot read the prompt from stdin\n");
				config_done(&cfg);
				return 1;
			}
			o.prompt = stdin_prompt;
		}
		struct model *m = model_load(cfg.model, cfg.tokenizer, &cause);
		if (!m) {
			fprintf(stderr, "llamad: %s\n", cause ? cause : "cannot load the model");
			free(cause);
			free(stdin_prompt);
			config_done(&cfg);
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
		config_done(&cfg);
		return rc;
	}
	if (o.echo || o.system || o.n_stops || seed_set) {
		fprintf(stderr, "llamad: --echo, --system, --stop and --seed need --prompt "
			"(clients set them per request when serving)\n");
		config_done(&cfg);
		return 2;
	}

	/* serve */
	sd_notifyf(0, "STATUS=loading %s", cfg.model);
	log_msg(LL_INFO, "loading %s", cfg.model);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct model *m = model_load(cfg.model, cfg.tokenizer, &cause);
	if (!m) {
		log_msg(LL_ERROR, "%s", cause ? cause : "cannot load the model");
		sd_notifyf(0, "STATUS=cannot load the model: %s", cause ? cause : "");
		free(cause);
		config_done(&cfg);
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	char desc[512];
	model_describe(m, desc, sizeof(desc));
	log_msg(LL_INFO, "loaded %s in %.0f ms", desc,
		(t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
	struct engine *e = engine_new(m, &cfg, &cause);
	if (!e) {
		log_msg(LL_ERROR, "%s", cause ? cause : "cannot start the engine");
		sd_notifyf(0, "STATUS=%s", cause ? cause : "cannot start the engine");
		free(cause);
		model_free(m);
		config_done(&cfg);
		return 1;
	}
	rc = server_run(&cfg, config_path, e, &cause);
	if (rc) {
		log_msg(LL_ERROR, "%s", cause ? cause : strerror(-rc));
		sd_notifyf(0, "STATUS=%s", cause ? cause : strerror(-rc));
		free(cause);
	} else {
		log_msg(LL_INFO, "stopped");
	}
	engine_free(e);
	model_free(m);
	config_done(&cfg);
	return rc ? 1 : 0;
}
