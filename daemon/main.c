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
#include <unistd.h>
#include <sys/random.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/log.h"
#include "daemon/oneshot.h"
#include "daemon/server.h"
#include "daemon/version.h"
#include "kernels/backend.h"
#include "proto/limits.h"
#include "text/chat.h"
#include "util/clock.h"
#include "util/file.h"

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
"      --system TEXT        system prompt (with --template llama3, llama2 or auto)\n"
"      --echo               print the prompt before the completion\n"
"      --stop TEXT          stop before TEXT (repeatable, up to " LLAMAD_STR(LLAMAD_MAX_STOPS) ")\n"
"      --seed S             sampler seed (default: random)\n"
"  -v, --verbose            print the model, seed and timings to stderr\n"
"  One-shot uses --template raw unless told otherwise; --template auto takes\n"
"  the model file's (llama3: <|start_header_id|> and <|eot_id|> in it; llama2:\n"
"  [INST] and <<SYS>>; else llama2, and says so).\n"
"\n"
"Exit status: 0 ok, 1 run-time error (model, socket, ...), 2 usage.\n", f);
}

static int bad_value(const char *opt, const char *val, const char *why)
{
	fprintf(stderr, "llamad: --%s %s: %s\n", opt, val, why);
	return 2;
}

/* What the command line and the config file ask for. */
struct args {
	struct config cfg;
	const char *config_path;     /* --config FILE (argv's), or NULL */
	int print_config;
	struct oneshot_opts o;       /* o.prompt set: one generation */
	const char *stops[LLAMAD_MAX_STOPS];  /* o.stops: argv's */
	int seed_set;                /* o.sp.seed given with --seed */
	int tmpl_set;                /* --template given */
};

#define GO_ON (-1)  /* no exit yet */

/* Read the file of --config / -c / --config=FILE, wherever it appears (the
 * flags then override it). GO_ON, or 2 with the message printed. */
static int load_config_arg(struct args *a, int argc, char **argv)
{
	char *cause = NULL;
	for (int i = 1; i < argc; i++) {
		if ((!strcmp(argv[i], "--config") || !strcmp(argv[i], "-c")) && i + 1 < argc)
			a->config_path = argv[++i];
		else if (!strncmp(argv[i], "--config=", 9))
			a->config_path = argv[i] + 9;
	}
	if (a->config_path && config_load(&a->cfg, a->config_path, 0, &cause) != 0) {
		fprintf(stderr, "llamad: %s\n", cause ? cause : a->config_path);
		free(cause);
		return 2;
	}
	return GO_ON;
}

/* Apply option --name (long name; val NULL for the flags without a value).
 * GO_ON, or 2 with the message printed. */
static int set_option(struct args *a, const char *name, const char *val)
{
	struct oneshot_opts *o = &a->o;
	if (!strcmp(name, "echo"))
		o->echo = 1;
	else if (!strcmp(name, "verbose"))
		o->verbose = 1;
	else if (!strcmp(name, "print-config"))
		a->print_config = 1;
	else if (!strcmp(name, "config"))
		;  /* read by load_config_arg */
	else if (!strcmp(name, "prompt"))
		o->prompt = val;
	else if (!strcmp(name, "system"))
		o->system = val;
	else if (!strcmp(name, "stop")) {
		if (o->n_stops == LLAMAD_MAX_STOPS)
			return bad_value(name, val,
					 "at most " LLAMAD_STR(LLAMAD_MAX_STOPS) " stop strings");
		a->stops[o->n_stops++] = val;
	} else if (!strcmp(name, "seed")) {
		char *end;
		errno = 0;
		unsigned long long sd = strtoull(val, &end, 10);
		if (errno || end == val || *end || val[0] == '-')
			return bad_value(name, val, "expected an unsigned integer");
		o->sp.seed = sd;
		a->seed_set = 1;
	} else {
		const char *why = NULL;
		int r = config_set(&a->cfg, name, val, 0, &why);
		if (r == -ENOENT) {
			fprintf(stderr, "llamad: unknown option '--%s'\nTry 'llamad --help'.\n", name);
			return 2;
		}
		if (r < 0)
			return bad_value(name, val, why);
		if (!strcmp(name, "template"))
			a->tmpl_set = 1;
	}
	return GO_ON;
}

/* The checks across options, once all are read (none for --print-config).
 * GO_ON, or 2 with the message printed. */
static int check_args(struct args *a)
{
	struct oneshot_opts *o = &a->o;
	if (a->print_config)
		return GO_ON;
	if (!a->cfg.model) {
		fprintf(stderr, "llamad: no model: give --model PATH or model = PATH in the "
			"config file\nTry 'llamad --help'.\n");
		return 2;
	}
	if (o->prompt) {
		/* one-shot is raw unless --template says otherwise (auto: the
		 * model file's, resolved once it is loaded) */
		o->tmpl = a->tmpl_set ? (enum chat_template)a->cfg.tmpl : CHAT_TEMPLATE_RAW;
		if (o->system && o->tmpl != CHAT_TEMPLATE_AUTO && !chat_rules(o->tmpl)->takes_system) {
			fprintf(stderr, "llamad: --system needs a chat template (--template llama3, "
				"llama2 or auto)\n");
			return 2;
		}
	} else if (o->echo || o->system || o->n_stops || a->seed_set) {
		fprintf(stderr, "llamad: --echo, --system, --stop and --seed need --prompt "
			"(clients set them per request when serving)\n");
		return 2;
	}
	return GO_ON;
}

/* The config file, then every option over it, then the checks across them:
 * fills *a (a->cfg already holds the defaults). Returns GO_ON, or the exit
 * status: 0 after --help / --version, 2 on a usage error (printed). */
static int parse_args(struct args *a, int argc, char **argv)
{
	a->o.stops = a->stops;
	int rc = load_config_arg(a, argc, argv);
	for (int i = 1; rc == GO_ON && i < argc; i++) {
		const char *arg = argv[i];
		char name[64];
		const char *val = NULL;
		if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(arg, "--version")) {
			printf("llamad %s\n", LLAMAD_VERSION);
			return 0;
		}
		if (arg[0] != '-' || !arg[1]) {
			fprintf(stderr, "llamad: unexpected argument '%s'\nTry 'llamad --help'.\n", arg);
			return 2;
		}
		if (arg[1] != '-') {  /* short options */
			static const char *const shorts[][2] = {
				{ "-m", "model" }, { "-t", "threads" }, { "-p", "prompt" },
				{ "-n", "max-tokens" }, { "-v", "verbose" }, { "-c", "config" },
			};
			const char *longname = NULL;
			for (size_t k = 0; k < sizeof(shorts) / sizeof(shorts[0]); k++)
				if (!strcmp(arg, shorts[k][0]))
					longname = shorts[k][1];
			if (!longname) {
				fprintf(stderr, "llamad: unknown option '%s'\nTry 'llamad --help'.\n", arg);
				return 2;
			}
			snprintf(name, sizeof(name), "%s", longname);
		} else {
			const char *eq = strchr(arg + 2, '=');
			size_t n = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
			if (n >= sizeof(name))
				n = sizeof(name) - 1;
			memcpy(name, arg + 2, n);
			name[n] = 0;
			if (eq)
				val = eq + 1;
		}
		int noarg = !strcmp(name, "echo") || !strcmp(name, "verbose") ||
			    !strcmp(name, "print-config");
		if (!noarg && !val) {
			if (i + 1 >= argc) {
				fprintf(stderr, "llamad: --%s needs a value\n", name);
				return 2;
			}
			val = argv[++i];
		}
		rc = set_option(a, name, val);
	}
	return rc == GO_ON ? check_args(a) : rc;
}

/* `llamad --prompt`: one generation to stdout. Returns the exit status. */
static int run_oneshot(struct args *a)
{
	const struct config *cfg = &a->cfg;
	struct oneshot_opts *o = &a->o;
	char *cause = NULL;
	o->threads = cfg->threads;
	o->device = cfg->device;
	o->gpu_weights = cfg->gpu_weights;
	o->kv_type = cfg->kv_type;
	o->max_tokens = cfg->max_tokens;
	o->sp.temperature = cfg->temperature;
	o->sp.top_k = cfg->top_k;
	o->sp.top_p = cfg->top_p;
	o->sp.min_p = cfg->min_p;
	o->sp.repeat_penalty = cfg->repeat_penalty;
	o->sp.penalty_last_n = cfg->repeat_last_n;
	o->sp.presence_penalty = cfg->presence_penalty;
	o->sp.frequency_penalty = cfg->frequency_penalty;
	if (!a->seed_set && getrandom(&o->sp.seed, sizeof(o->sp.seed), 0) != sizeof(o->sp.seed))
		o->sp.seed = (uint64_t)time(NULL);
	char *stdin_prompt = NULL;
	if (!strcmp(o->prompt, "-")) {
		size_t len;
		if (file_read_fd(STDIN_FILENO, (size_t)1 << 30, &stdin_prompt, &len) != 0) {
			fprintf(stderr, "llamad: cannot read the prompt from stdin\n");
			return 1;
		}
		o->prompt = stdin_prompt;
	}
	int rc = 1;
	struct model *m = model_load(cfg->model, cfg->tokenizer, &cause);
	if (!m) {
		fprintf(stderr, "llamad: %s\n", cause ? cause : "cannot load the model");
		free(cause);
		goto out;
	}
	char why[256] = "";
	if (o->tmpl == CHAT_TEMPLATE_AUTO) {
		o->tmpl = chat_resolve_template(CHAT_TEMPLATE_AUTO, m->chat_template,
						m->chat_template_text != NULL, why, sizeof(why));
		if (!m->chat_template_text || m->chat_template == CHAT_TEMPLATE_AUTO)
			fprintf(stderr, "llamad: --template auto: %s\n", why);  /* said plainly */
	}
	if (o->verbose) {
		char desc[512];
		model_describe(m, desc, sizeof(desc));
		fprintf(stderr, "llamad: %s\nllamad: template %s\nllamad: seed %llu\n", desc,
			why[0] ? why : chat_template_name(o->tmpl), (unsigned long long)o->sp.seed);
	}
	rc = oneshot_run(m, o, stdout);
	model_free(m);
out:
	free(stdin_prompt);
	return rc;
}

/* The kernels' messages (kernels/backend.h) into the daemon's log. */
static void backend_log_hook(int level, const char *msg)
{
	log_msg(level, "%s", msg);
}

_Static_assert((int)BACKEND_LOG_ERROR == LL_ERROR && (int)BACKEND_LOG_WARN == LL_WARN &&
	       (int)BACKEND_LOG_INFO == LL_INFO && (int)BACKEND_LOG_DEBUG == LL_DEBUG,
	       "the backend's log levels are the daemon's");

/* Load the model, start the engine and serve until told to stop. Returns
 * the exit status. */
static int run_serve(struct args *a)
{
	struct config *cfg = &a->cfg;
	char *cause = NULL;
	backend_set_log(backend_log_hook);  /* before the engine opens one */
	/* the socket first: a socket that cannot be used is said before a
	 * model of gigabytes is read */
	int lrc = server_check_socket(cfg, &cause);
	if (lrc) {
		log_msg(LL_ERROR, "%s", cause ? cause : strerror(-lrc));
		sd_notifyf(0, "STATUS=%s", cause ? cause : strerror(-lrc));
		free(cause);
		return 1;
	}
	sd_notifyf(0, "STATUS=loading %s", cfg->model);
	log_msg(LL_INFO, "loading %s", cfg->model);
	double t0 = clock_mono_s();
	struct model *m = model_load(cfg->model, cfg->tokenizer, &cause);
	if (!m) {
		log_msg(LL_ERROR, "%s", cause ? cause : "cannot load the model");
		sd_notifyf(0, "STATUS=cannot load the model: %s", cause ? cause : "");
		free(cause);
		return 1;
	}
	double t1 = clock_mono_s();
	char desc[512];
	model_describe(m, desc, sizeof(desc));
	log_msg(LL_INFO, "loaded %s in %.0f ms", desc, (t1 - t0) * 1e3);
	struct engine *e = engine_new(m, cfg, &cause);
	if (!e) {
		log_msg(LL_ERROR, "%s", cause ? cause : "cannot start the engine");
		sd_notifyf(0, "STATUS=%s", cause ? cause : "cannot start the engine");
		free(cause);
		model_free(m);
		return 1;
	}
	int rc = server_run(cfg, a->config_path, e, &cause);
	if (rc) {
		log_msg(LL_ERROR, "%s", cause ? cause : strerror(-rc));
		sd_notifyf(0, "STATUS=%s", cause ? cause : strerror(-rc));
		free(cause);
	} else {
		log_msg(LL_INFO, "stopped");
	}
	engine_free(e);
	model_free(m);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	static struct args a;  /* zeroed */
	config_defaults(&a.cfg);
	int rc = parse_args(&a, argc, argv);
	if (rc == GO_ON && a.print_config) {
		config_dump(&a.cfg, stdout);
		rc = 0;
	} else if (rc == GO_ON) {
		config_apply(NULL, &a.cfg);  /* log_level */
		if (getenv("JOURNAL_STREAM"))
			log_set_journal(1);
		rc = a.o.prompt ? run_oneshot(&a) : run_serve(&a);
	}
	config_done(&a.cfg);
	return rc;
}
