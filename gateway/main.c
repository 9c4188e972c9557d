/*
 * gateway/main.c — llamad-http: options, listeners (a Unix socket by
 * default, loopback TCP when asked, or the sockets systemd passes), the
 * token file, signals. See llamad-http(8).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/http.h>
#include <systemd/sd-daemon.h>

#include "gateway/conn.h"
#include "gateway/gw.h"
#include "proto/frame.h"
#include "proto/path.h"
#include "util/clock.h"

#define MAX_LISTEN 8

static const char usage[] =
	"Usage: llamad-http [OPTION]...\n"
	"OpenAI- and Ollama-compatible HTTP in front of llamad: stateless requests are\n"
	"answered on llamad's persistent sessions (only a conversation's new turn is\n"
	"computed). Each caller is served as its own user.\n"
	"\n"
	"  -l, --listen ADDR        where to listen, repeatable: a Unix socket path (or\n"
	"                           unix:PATH), or 127.0.0.1:PORT / [::1]:PORT / localhost:PORT\n"
	"                           (default: http.sock beside llamad's socket; systemd's\n"
	"                           sockets when socket-activated)\n"
	"  -s, --socket PATH        llamad's socket (default as llamactl's: $LLAMAD_SOCKET,\n"
	"                           $XDG_RUNTIME_DIR/llamad/llamad.sock, " LLAMAD_SOCKET_SYSTEM ")\n"
	"      --name NAME          the name requests give the model of --socket (default: llamad)\n"
	"  -m, --model NAME=PATH    serve model NAME from the llamad at socket PATH; repeatable\n"
	"                           (then --socket and --name are not used)\n"
	"      --instances[=DIR]    also serve, for each DIR/NAME.conf but llamad.conf, model\n"
	"                           NAME from the llamad@NAME instance's socket, NAME.sock\n"
	"                           beside --socket (DIR: /etc/llamad)\n"
	"      --token-file FILE    TCP callers must send Authorization: Bearer TOKEN; each line\n"
	"                           of FILE is \"TOKEN USER\" (the user the caller is served as)\n"
	"      --allow-remote       listen on addresses other than loopback (needs --token-file)\n"
	"      --socket-mode MODE   permissions of the Unix socket (default 0660)\n"
	"      --socket-group GROUP group of the Unix socket (default: that of llamad's socket)\n"
	"      --max-body BYTES     largest request body (default 8388608); larger: 413\n"
	"      --max-header-size BYTES  largest request head: request line and headers\n"
	"                           (default 32768; at most 100 header lines); larger: 431\n"
	"      --header-timeout SECONDS  a request's head must be whole this long after its\n"
	"                           first byte, its body that plus 1 s per 64 KiB (default 10);\n"
	"                           later: 408 and the connection is closed\n"
	"      --timeout SECONDS    a client that sends or reads nothing this long is cut off\n"
	"                           (default 120)\n"
	"      --max-caller-connections N  connections one caller (a user; a remote address\n"
	"                           until its token) may hold at once (default 64); more: 429\n"
	"      --max-conversations N  sessions kept per caller and model (default 64); the\n"
	"                           least recently used is dropped for a new one\n"
	"      --log-prompts        log each request's messages (never by default)\n"
	"  -v, --verbose            log each refused request and dropped session\n"
	"  -q, --quiet              log warnings and errors only\n"
	"  -h, --help               this text\n"
	"      --version            the version\n";

static struct gw G;
static struct evhttp_bound_socket *bound[MAX_LISTEN];
static size_t n_bound;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, G.journal ? "<3>llamad-http: " : "llamad-http: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool valid_name(const char *s)
{
	if (!*s || strlen(s) > 128)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
		      strchr("._:-", *s)))
			return false;
	return true;
}

static void add_model(const char *name, const char *sock)
{
	if (!valid_name(name))
		die("model name '%s': use 1-128 of A-Z a-z 0-9 . _ : -", name);
	for (size_t i = 0; i < G.n_models; i++)
		if (!strcmp(G.models[i].name, name))
			die("model '%s' is named twice", name);
	if (!*sock)
		die("model '%s': no socket path", name);
	G.models = realloc(G.models, (G.n_models + 1) * sizeof(*G.models));
	if (!G.models)
		die("out of memory");
	G.models[G.n_models++] = (struct gw_model){ strdup(name), strdup(sock), NULL };
}

/* --instances: a model for each DIR/NAME.conf (NAME not llamad) at
 * NAME.sock in the folder of the main socket (the llamad@NAME units'). */
static void add_instances(const char *dir, const char *main_sock)
{
	DIR *d = opendir(dir);
	if (!d)
		die("--instances %s: %s", dir, strerror(errno));
	const char *slash = strrchr(main_sock, '/');
	int dl = slash ? (int)(slash - main_sock) : 1;
	const char *sd = slash ? main_sock : ".";
	struct dirent *e;
	char **names = NULL;
	size_t n = 0;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l <= 5 || strcmp(e->d_name + l - 5, ".conf") || !strcmp(e->d_name, "llamad.conf"))
			continue;
		names = realloc(names, (n + 1) * sizeof(*names));
		if (!names || !(names[n] = strndup(e->d_name, l - 5)))
			die("out of memory");
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		char path[PATH_MAX];
		snprintf(path, sizeof(path), "%.*s/%s.sock", dl, sd, names[i]);
		if (valid_name(names[i]))
			add_model(names[i], path);
		else
			gw_log(&G, GW_WARN, "--instances: %s/%s.conf: not a model name, skipped", dir, names[i]);
		free(names[i]);
	}
	free(names);
}

static uid_t user_uid(const char *u, const char *what)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(u, &end, 10);
	if (*u && !*end && !errno && v < UINT_MAX)
		return (uid_t)v;
	struct passwd *pw = getpwnam(u);
	if (!pw)
		die("%s: no user '%s'", what, u);
	return pw->pw_uid;
}

static void read_tokens(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		die("--token-file %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & 0007))
		die("--token-file %s: readable by others (mode %o); chmod o-rwx it", path,
		    (unsigned)(st.st_mode & 0777));
	char line[1024];
	int ln = 0;
	while (fgets(line, sizeof(line), f)) {
		ln++;
		char *p = line;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '#' || *p == '\n' || !*p)
			continue;
		char tok[512], user[256], extra[8];
		int k = sscanf(p, "%511s %255s %7s", tok, user, extra);
		if (k != 2)
			die("--token-file %s:%d: want \"TOKEN USER\"", path, ln);
		if (strlen(tok) < 16)
			die("--token-file %s:%d: a token of fewer than 16 characters is too easy to guess", path, ln);
		char what[600];
		snprintf(what, sizeof(what), "--token-file %s:%d", path, ln);
		G.tokens = realloc(G.tokens, (G.n_tokens + 1) * sizeof(*G.tokens));
		if (!G.tokens)
			die("out of memory");
		G.tokens[G.n_tokens++] = (struct gw_token){ strdup(tok), user_uid(user, what), strdup(user) };
	}
	fclose(f);
	if (!G.n_tokens)
		die("--token-file %s: no tokens", path);
}

static bool is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		if (IN6_IS_ADDR_LOOPBACK(a))
			return true;
		if (IN6_IS_ADDR_V4MAPPED(a))
			return a->s6_addr[12] == 127;
	}
	return false;
}

static void accept_fd(int fd, const char *what)
{
	if (n_bound == MAX_LISTEN)
		die("at most %d listening sockets", MAX_LISTEN);
	evutil_make_socket_nonblocking(fd);
	bound[n_bound] = evhttp_accept_socket_with_handle(G.http, fd);
	if (!bound[n_bound])
		die("cannot listen on %s", what);
	conn_listener(&G, evhttp_bound_socket_get_listener(bound[n_bound]));
	n_bound++;
}

static void listen_tcp(const char *addr, bool allow_remote)
{
	char host[256];
	const char *colon = strrchr(addr, ':');
	if (!colon || colon == addr)
		die("--listen %s: want HOST:PORT or a socket path", addr);
	size_t hl = (size_t)(colon - addr);
	if (hl >= sizeof(host))
		die("--listen %s: host too long", addr);
	memcpy(host, addr, hl);
	host[hl] = 0;
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = 0;
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE };
	struct addrinfo *res;
	int rc = getaddrinfo(host, colon + 1, &hints, &res);
	if (rc)
		die("--listen %s: %s", addr, gai_strerror(rc));
	int n = 0;
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		if (!is_loopback(ai->ai_addr) && !allow_remote)
			die("--listen %s: not a loopback address; callers elsewhere need --allow-remote "
			    "and --token-file", addr);
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int one = 1;
		if (fd < 0)
			die("--listen %s: %s", addr, strerror(errno));
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (ai->ai_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0)
			die("--listen %s: %s", addr, strerror(errno));
		accept_fd(fd, addr);
		n++;
	}
	freeaddrinfo(res);
	if (!n)
		die("--listen %s: no address", addr);
	gw_log(&G, GW_INFO, "listening on http://%s", addr);
}

/* group_forced: --socket-group named it (failing to give the socket to it
 * stops the start-up); otherwise it is llamad's socket's group, given when
 * this user may. */
static void listen_unix(const char *path, mode_t mode, const char *group, bool group_forced)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		die("--listen %s: path too long for a Unix socket", path);
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			die("--listen %s: exists and is not a socket", path);
		int c = frame_dial(path);
		if (c >= 0) {
			close(c);
			die("--listen %s: another program listens there", path);
		}
		unlink(path);
	}
	mode_t old = umask(0177);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0 || listen(fd, 128) < 0)
		die("--listen %s: %s", path, strerror(errno));
	if (group) {
		struct group *gr = getgrnam(group);
		if (!gr)
			die("--socket-group: no group '%s'", group);
		if (chown(path, (uid_t)-1, gr->gr_gid) < 0) {
			if (group_forced)
				die("--listen %s: chgrp %s: %s", path, group, strerror(errno));
			gw_log(&G, GW_WARN, "%s: cannot give the socket to group %s (that of llamad's "
			       "socket): %s; it keeps this user's group", path, group, strerror(errno));
		}
	}
	if (chmod(path, mode) < 0)
		die("--listen %s: chmod: %s", path, strerror(errno));
	accept_fd(fd, path);
	gw_log(&G, GW_INFO, "listening on %s", path);
}

static char *default_listen(const char *llamad_sock)
{
	const char *slash = strrchr(llamad_sock, '/');
	size_t dl = slash ? (size_t)(slash - llamad_sock) : 0;
	char *p = malloc(dl + 16);
	if (!p)
		die("out of memory");
	if (slash)
		memcpy(p, llamad_sock, dl);
	strcpy(p + dl, slash ? "/http.sock" : "http.sock");
	return p;
}

/* Take the hard open-file limit as the soft one: every caller's
 * connection, and each one's llamad connection, is a descriptor (the
 * default soft limit of 1024 let 1,100 connections of one user stop
 * every caller's accept). */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
	struct rlimit nl = { want, rl.rlim_max };
	if (setrlimit(RLIMIT_NOFILE, &nl) != 0)
		gw_log(&G, GW_WARN, "cannot raise the open-file limit to %llu: %s",
		       (unsigned long long)want, strerror(errno));
}

static struct event *timer_ev;

static void stop_check(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	static int ticks;
	if (G.st.active == 0 || ++ticks > 100)
		event_base_loopbreak(G.base);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	(void)arg;
	if (G.stopping)
		return;
	G.stopping = true;
	gw_log(&G, GW_INFO, "%s: stopping (%u requests running)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
	       G.st.active);
	sd_notify(0, "STOPPING=1");
	for (size_t i = 0; i < n_bound; i++)
		evhttp_del_accept_socket(G.http, bound[i]);
	n_bound = 0;
	struct timeval tv = { 0, 100000 };
	timer_ev = event_new(G.base, -1, EV_PERSIST, stop_check, NULL);
	event_add(timer_ev, &tv);
}

/* optarg as a number of lo to hi (unit: what it counts, for the error). */
static unsigned long num_opt(const char *opt, unsigned long lo, unsigned long hi, const char *unit)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(optarg, &end, 10);
	if (*end || end == optarg || errno || optarg[strspn(optarg, " \t")] == '-' || v < lo || v > hi)
		die("%s %s: want %lu to %lu%s", opt, optarg, lo, hi, unit);
	return v;
}

int main(int argc, char **argv)
{
	enum { O_NAME = 256, O_INST, O_TOKENS, O_REMOTE, O_MODE, O_GROUP, O_BODY, O_TIMEOUT, O_CONVS,
	       O_LOGP, O_VERSION, O_HEADER, O_HTIMEOUT, O_CALLER };
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "socket", required_argument, NULL, 's' },
		{ "name", required_argument, NULL, O_NAME },
		{ "model", required_argument, NULL, 'm' },
		{ "instances", optional_argument, NULL, O_INST },
		{ "token-file", required_argument, NULL, O_TOKENS },
		{ "allow-remote", no_argument, NULL, O_REMOTE },
		{ "socket-mode", required_argument, NULL, O_MODE },
		{ "socket-group", required_argument, NULL, O_GROUP },
		{ "max-body", required_argument, NULL, O_BODY },
		{ "max-header-size", required_argument, NULL, O_HEADER },
		{ "header-timeout", required_argument, NULL, O_HTIMEOUT },
		{ "max-caller-connections", required_argument, NULL, O_CALLER },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "max-conversations", required_argument, NULL, O_CONVS },
		{ "log-prompts", no_argument, NULL, O_LOGP },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, O_VERSION },
		{ 0 },
	};
	const char *listens[MAX_LISTEN];
	size_t n_listen = 0;
	const char *sock = NULL, *name = "llamad", *tokens = NULL, *group = NULL, *inst = NULL;
	bool remote = false;
	long mode = 0660;
	G.max_body = 8u << 20;
	G.max_header = 32u << 10;
	G.header_timeout = 10;
	G.max_caller_conns = 64;
	G.timeout_s = 120;
	G.max_convs = 64;
	G.journal = getenv("JOURNAL_STREAM") != NULL;  /* as llamad decides */
	setvbuf(stderr, NULL, _IOLBF, 0);
	int o;
	char *end;
	while ((o = getopt_long(argc, argv, "l:s:m:vqh", opts, NULL)) != -1) {
		switch (o) {
		case 'l':
			if (n_listen == MAX_LISTEN)
				die("at most %d --listen", MAX_LISTEN);
			listens[n_listen++] = optarg;
			break;
		case 's':
			sock = optarg;
			break;
		case O_NAME:
			name = optarg;
			break;
		case 'm': {
			char *eq = strchr(optarg, '=');
			if (!eq)
				die("--model %s: want NAME=SOCKET", optarg);
			*eq = 0;
			add_model(optarg, eq + 1);
			break;
		}
		case O_INST:
			inst = optarg ? optarg : "/etc/llamad";
			break;
		case O_TOKENS:
			tokens = optarg;
			break;
		case O_REMOTE:
			remote = true;
			break;
		case O_MODE:
			mode = strtol(optarg, &end, 8);
			if (*end || mode < 0 || mode > 0777)
				die("--socket-mode %s: want octal permissions like 0660", optarg);
			break;
		case O_GROUP:
			group = optarg;
			break;
		case O_BODY:
			G.max_body = num_opt("--max-body", 1024, 1u << 30, " bytes");
			break;
		case O_HEADER:
			G.max_header = num_opt("--max-header-size", 1024, 1u << 20, " bytes");
			break;
		case O_HTIMEOUT:
			G.header_timeout = (int)num_opt("--header-timeout", 1, 3600, " seconds");
			break;
		case O_CALLER:
			G.max_caller_conns = (uint32_t)num_opt("--max-caller-connections", 1, 1000000, "");
			break;
		case O_TIMEOUT:
			G.timeout_s = (int)num_opt("--timeout", 1, 86400, " seconds");
			break;
		case O_CONVS:
			G.max_convs = num_opt("--max-conversations", 1, 1000000, "");
			break;
		case O_LOGP:
			G.log_prompts = true;
			break;
		case 'v':
			G.verbose++;
			break;
		case 'q':
			G.quiet = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		case O_VERSION:
			printf("llamad-http %s\n", GW_VERSION);
			return 0;
		default:
			fprintf(stderr, "Try 'llamad-http --help'.\n");
			return 2;
		}
	}
	if (optind < argc)
		die("unexpected argument '%s' (try --help)", argv[optind]);
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();
	char *def_sock = NULL, *def_listen = NULL;
	if (!G.n_models) {
		if (!sock)
			sock = def_sock = path_default_socket();
		if (!sock)
			die("out of memory");
		add_model(name, sock);
		if (inst)
			add_instances(inst, sock);
	} else if (inst) {
		die("--instances goes with --socket, not with --model");
	}
	if (tokens)
		read_tokens(tokens);
	if (remote && !tokens)
		die("--allow-remote needs --token-file: callers elsewhere must send a token");
	G.self_uid = geteuid();
	G.base = event_base_new();
	G.http = G.base ? evhttp_new(G.base) : NULL;
	if (!G.http)
		die("cannot set up libevent");
	G.started = clock_mono_s();
	gw_http_setup(&G);

	int nfds = sd_listen_fds(1);
	for (int i = 0; i < nfds; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
			die("socket from systemd: %s", strerror(errno));
		if (ss.ss_family != AF_UNIX && !is_loopback((struct sockaddr *)&ss) && !remote)
			die("systemd passed a socket on an address other than loopback: that needs "
			    "--allow-remote and --token-file");
		accept_fd(fd, "a socket from systemd");
	}
	if (nfds <= 0) {
		if (!n_listen) {
			def_listen = default_listen(G.models[0].socket);
			listens[n_listen++] = def_listen;
		}
		/* the Unix socket's group: that of llamad's socket, so the same
		 * users reach both */
		struct stat st;
		char gbuf[64];
		bool forced = group != NULL;
		if (!group && stat(G.models[0].socket, &st) == 0 && st.st_gid != getegid()) {
			struct group *gr = getgrgid(st.st_gid);
			if (gr) {
				snprintf(gbuf, sizeof(gbuf), "%s", gr->gr_name);
				group = gbuf;
			}
		}
		for (size_t i = 0; i < n_listen; i++) {
			const char *a = listens[i];
			if (!strncmp(a, "unix:", 5))
				listen_unix(a + 5, (mode_t)mode, group, forced);
			else if (a[0] == '/' || a[0] == '.')
				listen_unix(a, (mode_t)mode, group, forced);
			else
				listen_tcp(a, remote);
		}
	}
	for (size_t i = 0; i < G.n_models; i++)
		gw_log(&G, GW_INFO, "model %s: llamad at %s", G.models[i].name, G.models[i].socket);
	struct event *sig_term = evsignal_new(G.base, SIGTERM, on_signal, NULL);
	struct event *sig_int = evsignal_new(G.base, SIGINT, on_signal, NULL);
	event_add(sig_term, NULL);
	event_add(sig_int, NULL);
	sd_notify(0, "READY=1");
	event_base_dispatch(G.base);
	gw_log(&G, GW_INFO, "stopped");
	event_free(sig_term);
	event_free(sig_int);
	if (timer_ev)
		event_free(timer_ev);
	evhttp_free(G.http);
	event_base_free(G.base);
	conv_free_all(&G.conv);
	free(G.known);
	for (size_t i = 0; i < G.n_models; i++) {
		free(G.models[i].name);
		free(G.models[i].socket);
		free(G.models[i].desc);
	}
	free(G.models);
	for (size_t i = 0; i < G.n_tokens; i++) {
		free(G.tokens[i].token);
		free(G.tokens[i].who);
	}
	free(G.tokens);
	free(def_sock);
	free(def_listen);
	return 0;
}
