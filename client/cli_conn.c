/*
 * client/cli_conn.c — llamactl's connecting: the socket found and dialled, Hello, calls that
 * expect a reply, opening, cancelling and dropping sessions (cli.h).
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "client/cli.h"

/* The Hello on a fresh connection: 0 or -errno; a refusal exits. */
static int say_hello(struct cli *cli)
{
	Llamad__Response *r = NULL;
	int rc = conn_hello(&cli->conn, &r);
	if (rc)
		return rc;
	cli_expect(r, LLAMAD__RESPONSE__BODY_HELLO);
	llamad__response__free_unpacked(r, NULL);
	return 0;
}

int cli_try_connect(struct cli *cli)
{
	conn_close(&cli->conn);
	int rc = conn_connect(&cli->conn, cli->socket);
	if (!rc && (rc = say_hello(cli)) != 0)
		conn_close(&cli->conn);
	return rc;
}

/* What to do about a failed connect (err < 0) to path, into buf (cap). */
static const char *connect_hint(const char *path, int err, char *buf, size_t cap)
{
	struct stat st;
	if (err == -ENOENT || err == -ECONNREFUSED)
		return " (is llamad running? `systemctl status llamad.socket`, or --socket PATH)";
	if (err == -EACCES && stat(path, &st) == 0) {
		struct group *g = getgrgid(st.st_gid);
		struct passwd *u = getpwuid(st.st_uid);
		const char *gname = g ? g->gr_name : "?";
		/* root's group: joining it would hand out root's files; a group of
		 * the daemon's own users is what socket_group is for */
		if (st.st_gid == 0) {
			if (snprintf(buf, cap, " (the socket is %04o %s:%s: only root reaches it; "
				     "for other users, set socket_group = GROUP in llamad.conf "
				     "(or --socket-group GROUP) to a group of the daemon's users, "
				     "e.g. llamad, and add them to it, never to root)",
				     (unsigned)(st.st_mode & 07777), u ? u->pw_name : "?",
				     gname) < 0)
				return "";
			return buf;
		}
		if (snprintf(buf, cap, " (the socket is %04o %s:%s: the daemon's users are the "
			     "members of group %s; `sudo usermod -aG %s %s`, then log in again)",
			     (unsigned)(st.st_mode & 07777), u ? u->pw_name : "?", gname, gname,
			     gname, getenv("USER") ? getenv("USER") : "$USER") < 0)
			return "";
		return buf;
	}
	return "";
}

/* Connect to cli->socket or the first candidate with a daemon (cli_connect);
 * cli->socket becomes the path reached, else the last tried. 0, or the
 * last -errno with every path tried and its error in tried ("A: why, nor
 * B: why"). */
static int dial(struct cli *cli, char *tried, size_t cap)
{
	int n = cli->n_candidates > 0 ? cli->n_candidates : 1;
	int rc = -ENOENT;
	size_t used = 0;
	tried[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (cli->n_candidates > 0)
			cli->socket = cli->candidates[i];
		rc = conn_connect(&cli->conn, cli->socket);
		if (rc == 0)
			return 0;
		int k = snprintf(tried + used, cap - used, "%s%s: %s", i ? ", nor to " : "",
				 cli->socket, strerror(-rc));
		if (k > 0)
			used += (size_t)k < cap - used ? (size_t)k : cap - used - 1;
		if (rc != -ENOENT && rc != -ECONNREFUSED)
			break;
	}
	return rc;
}

void cli_connect(struct cli *cli)
{
	char tried[1200];
	int rc = dial(cli, tried, sizeof(tried));
	if (rc) {
		char hint[512];
		cli_error("connect", 0, "cannot connect to %s%s", tried,
			  connect_hint(cli->socket, rc, hint, sizeof(hint)));
		exit(EXIT_CONNECT);
	}
	rc = say_hello(cli);
	if (rc)
		cli_die_conn(cli, rc);
}

Llamad__Response *cli_call_any(struct cli *cli, Llamad__Request *req)
{
	Llamad__Response *r;
	int rc = conn_call(&cli->conn, req, &r);
	if (rc)
		cli_die_conn(cli, rc);
	return r;
}

Llamad__Response *cli_call(struct cli *cli, Llamad__Request *req,
			   Llamad__Response__BodyCase want)
{
	return cli_expect(cli_call_any(cli, req), want);
}

void cli_ephemeral_name(char *buf, size_t n)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
	}
	snprintf(buf, n, "llamactl-%ld-%016llx", (long)getpid(), (unsigned long long)r);
}

Llamad__Response *cli_open_session(struct cli *cli, const char *session,
				   const struct open_opts *op, bool errors_ok)
{
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = (char *)session;
	o.system = (char *)op->system;
	if (op->tmpl != LLAMAD__TEMPLATE__TEMPLATE_DEFAULT) {
		PB_SET(&o, template_, op->tmpl);
	}
	if (op->policy != LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT) {
		PB_SET(&o, context_policy, op->policy);
	}
	if (op->ephemeral) {
		PB_SET(&o, ephemeral, 1);
	}
	if (op->create_only) {
		PB_SET(&o, create_only, 1);
	}
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_OPEN;
	req.open = &o;
	Llamad__Response *r = cli_call_any(cli, &req);
	if (errors_ok && r->body_case == LLAMAD__RESPONSE__BODY_ERROR)
		return r;
	cli_expect(r, LLAMAD__RESPONSE__BODY_SESSION);
	if (r->session && r->session->has_context_policy)
		cli->policy = (int)r->session->context_policy;
	return r;
}

Llamad__Response *cli_open_chat(struct cli *cli, const char *session, struct open_opts o)
{
	if (o.create_only && o.policy == LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT)
		o.policy = LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT;  /* a new one anyway */
	if (o.policy != LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT || o.create_only)
		return cli_open_session(cli, session, &o, false);
	/* create it with shift; if it exists, open it as it is */
	struct open_opts create = o;
	create.policy = LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT;
	create.create_only = true;
	Llamad__Response *r = cli_open_session(cli, session, &create, true);
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR && r->error &&
	    r->error->code == LLAMAD__ERROR_CODE__SESSION_EXISTS) {
		llamad__response__free_unpacked(r, NULL);
		return cli_open_session(cli, session, &o, false);
	}
	return cli_expect(r, LLAMAD__RESPONSE__BODY_SESSION);
}

void cli_cancel_session(struct cli *cli, const char *session)
{
	Llamad__Cancel cn = LLAMAD__CANCEL__INIT;
	cn.session = (char *)session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_CANCEL;
	req.cancel = &cn;
	llamad__response__free_unpacked(cli_call(cli, &req, LLAMAD__RESPONSE__BODY_OK), NULL);
}

void cli_drop_session(struct cli *cli, const char *session, bool quiet)
{
	Llamad__Drop d = LLAMAD__DROP__INIT;
	d.session = (char *)session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_DROP;
	req.drop = &d;
	Llamad__Response *r = cli_call_any(cli, &req);
	if (!quiet)
		cli_expect(r, LLAMAD__RESPONSE__BODY_OK);
	llamad__response__free_unpacked(r, NULL);
}
