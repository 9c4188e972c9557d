/*
 * tests/tools/protoclient.c — a tiny, generic llamad protocol client for
 * shell tests: one request, one line per response on stdout.
 *
 *   protoclient SOCKET hello
 *   protoclient SOCKET open NAME [raw|llama2|llama3] [ephemeral]
 *   protoclient SOCKET append NAME user|system|assistant|raw TEXT
 *   protoclient SOCKET list
 *   protoclient SOCKET info NAME
 *   protoclient SOCKET drop NAME
 *   protoclient SOCKET fork SRC DST
 *   protoclient SOCKET rewind NAME
 *   protoclient SOCKET generate NAME PROMPT [MAX_TOKENS]   (greedy; opens NAME,
 *                                                         llama2 unless it exists)
 *   protoclient SOCKET status
 *   protoclient SOCKET hello-as UID [CALLER]   (a gateway's Hello: on_behalf_of_uid)
 *
 * Several operations go on one connection, in order, separated by "--":
 *   protoclient SOCKET hello-as 65533 -- open NAME -- list
 * (each answered before the next is sent; an error does not stop them).
 *
 * Lines: "hello VERSION CONTEXT_LENGTH", "session NAME tokens=N owner=UID
 * busy=0|1 turns=N created=0|1" (an append's adds " added=N"), "sessions
 * N" (after the list's sessions),
 * "token TEXT" (newlines as \n), "done REASON generated=N prompt=N
 * session_tokens=N", "ok", "status sessions=N active=N connections=N
 * kv_free=N kv_total=N", "error CODE_NAME (short name): message"; hello-as
 * prints "hello VERSION CONTEXT_LENGTH uid=UID" (HelloReply.uid).
 *
 * Exit status: 0 when the last reply (of the last operation) is not an
 * error, 1 when it is, 2 on usage or connection errors.
 *
 * Built by the scripts that use it, not by make (from the sources, so that
 * a sanitizer build's libllamad-proto.a is not needed):
 *   cc -std=c11 -D_GNU_SOURCE -I. -I$BUILD/proto tests/tools/protoclient.c \
 *      proto/frame.c $BUILD/proto/llamad.pb-c.c -lprotobuf-c -o protoclient
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/frame.h"

static int usage(void)
{
	fputs("usage: protoclient SOCKET hello|hello-as|open|append|list|info|drop|fork|rewind|"
	      "generate|status [ARGS...] [-- OP [ARGS...]]...\n", stderr);
	return 2;
}

static int dial(const char *path)
{
	int fd = frame_dial(path);
	if (fd < 0) {
		fprintf(stderr, "protoclient: cannot connect to %s: %s\n", path, strerror(-fd));
		return -1;
	}
	return fd;
}

static void print_text(const char *t)
{
	for (; t && *t; t++) {
		if (*t == '\n')
			fputs("\\n", stdout);
		else if (*t == '\\')
			fputs("\\\\", stdout);
		else
			putchar(*t);
	}
}

static void print_session(const Llamad__SessionInfo *i)
{
	printf("session %s tokens=%u owner=%u busy=%d turns=%u created=%d",
	       i->session ? i->session : "", i->tokens, i->owner_uid, i->busy ? 1 : 0, i->turns,
	       i->has_created && i->created ? 1 : 0);
	if (i->has_tokens_added)
		printf(" added=%u", i->tokens_added);
	putchar('\n');
}

static int show_uid;   /* hello-as: the HelloReply's uid too */

/* Print r as one line (a list: one per session, then a count). 1 if it
 * ends the request. */
static int print_response(const Llamad__Response *r, int *is_error)
{
	*is_error = 0;
	switch (r->body_case) {
	case LLAMAD__RESPONSE__BODY_ERROR: {
		const ProtobufCEnumValue *v =
			protobuf_c_enum_descriptor_get_value(&llamad__error_code__descriptor,
							     r->error->code);
		printf("error %s (%s): ", v ? v->name : "?", frame_error_name(r->error->code));
		print_text(r->error->message);
		putchar('\n');
		*is_error = 1;
		return 1;
	}
	case LLAMAD__RESPONSE__BODY_HELLO:
		printf("hello %u %u", r->hello->protocol_version, r->hello->context_length);
		if (show_uid)
			printf(" uid=%s%u", r->hello->has_uid ? "" : "unset:", r->hello->uid);
		putchar('\n');
		return 1;
	case LLAMAD__RESPONSE__BODY_SESSION:
		print_session(r->session);
		return 1;
	case LLAMAD__RESPONSE__BODY_SESSIONS:
		for (size_t k = 0; k < r->sessions->n_sessions; k++)
			print_session(r->sessions->sessions[k]);
		printf("sessions %zu\n", r->sessions->n_sessions);
		return 1;
	case LLAMAD__RESPONSE__BODY_TOKEN:
		fputs("token ", stdout);
		print_text(r->token->text);
		putchar('\n');
		return 0;
	case LLAMAD__RESPONSE__BODY_DONE: {
		const ProtobufCEnumValue *v =
			protobuf_c_enum_descriptor_get_value(&llamad__stop_reason__descriptor,
							     r->done->reason);
		printf("done %s generated=%u prompt=%u session_tokens=%u\n", v ? v->name : "?",
		       r->done->generated_tokens, r->done->prompt_tokens, r->done->session_tokens);
		return 1;
	}
	case LLAMAD__RESPONSE__BODY_OK:
		puts("ok");
		return 1;
	case LLAMAD__RESPONSE__BODY_STATUS:
		printf("status sessions=%u active=%u connections=%u kv_free=%u kv_total=%u\n",
		       r->status->sessions, r->status->active, r->status->connections,
		       r->status->kv_blocks_free, r->status->kv_blocks_total);
		return 1;
	default:
		printf("reply body=%d\n", (int)r->body_case);
		return 1;
	}
}

/* Send q and print replies until its terminal one. 0, 1 (error reply) or
 * 2 (connection). */
static int call(int fd, Llamad__Request *q)
{
	static uint64_t next_id = 1;
	q->has_id = 1;
	q->id = next_id++;
	int rc = frame_send(fd, &q->base);
	if (rc) {
		fprintf(stderr, "protoclient: send: %s\n", strerror(-rc));
		return 2;
	}
	for (;;) {
		int err = 0;
		Llamad__Response *r = frame_recv_response(fd, 64u << 20, &err);
		if (!r) {
			fprintf(stderr, "protoclient: receive: %s\n", strerror(-err));
			return 2;
		}
		int is_error = 0, done = 0;
		if (r->id == q->id || r->id == 0)
			done = print_response(r, &is_error);
		llamad__response__free_unpacked(r, NULL);
		fflush(stdout);
		if (done)
			return is_error;
	}
}

/* Operation op with its nargs arguments a on connection fd: 0, 1 (an
 * error reply), 2 (usage or connection). */
static int run_op(int fd, const char *op, int nargs, char **a)
{
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	Llamad__Hello m_hello = LLAMAD__HELLO__INIT;
	Llamad__OpenSession m_open = LLAMAD__OPEN_SESSION__INIT;
	Llamad__Append m_app = LLAMAD__APPEND__INIT;
	Llamad__ListSessions m_list = LLAMAD__LIST_SESSIONS__INIT;
	Llamad__GetInfo m_info = LLAMAD__GET_INFO__INIT;
	Llamad__Drop m_drop = LLAMAD__DROP__INIT;
	Llamad__Fork m_fork = LLAMAD__FORK__INIT;
	Llamad__Rewind m_rewind = LLAMAD__REWIND__INIT;
	Llamad__Generate m_gen = LLAMAD__GENERATE__INIT;
	Llamad__SamplerOptions so = LLAMAD__SAMPLER_OPTIONS__INIT;
	Llamad__GetStatus m_status = LLAMAD__GET_STATUS__INIT;

	show_uid = 0;
	if (!strcmp(op, "hello") && nargs == 0) {
		m_hello.has_protocol_version = 1;
		m_hello.protocol_version = LLAMAD_PROTOCOL_VERSION;
		m_hello.client = (char *)"protoclient";
		q.op_case = LLAMAD__REQUEST__OP_HELLO;
		q.hello = &m_hello;
	} else if (!strcmp(op, "hello-as") && (nargs == 1 || nargs == 2)) {
		char *end;
		unsigned long u = strtoul(a[0], &end, 10);
		if (*end || end == a[0])
			return usage();
		m_hello.has_protocol_version = 1;
		m_hello.protocol_version = LLAMAD_PROTOCOL_VERSION;
		m_hello.client = (char *)"protoclient";
		m_hello.has_on_behalf_of_uid = 1;
		m_hello.on_behalf_of_uid = (uint32_t)u;
		if (nargs == 2)
			m_hello.caller = a[1];
		q.op_case = LLAMAD__REQUEST__OP_HELLO;
		q.hello = &m_hello;
		show_uid = 1;
	} else if (!strcmp(op, "open") && nargs >= 1 && nargs <= 3) {
		m_open.session = a[0];
		for (int k = 1; k < nargs; k++) {
			if (!strcmp(a[k], "raw") || !strcmp(a[k], "llama2") || !strcmp(a[k], "llama3")) {
				m_open.has_template_ = 1;
				m_open.template_ = !strcmp(a[k], "raw") ? LLAMAD__TEMPLATE__TEMPLATE_RAW
						   : !strcmp(a[k], "llama3") ? LLAMAD__TEMPLATE__TEMPLATE_LLAMA3
									     : LLAMAD__TEMPLATE__TEMPLATE_LLAMA2;
			} else if (!strcmp(a[k], "ephemeral")) {
				m_open.has_ephemeral = 1;
				m_open.ephemeral = 1;
			} else {
				return usage();
			}
		}
		q.op_case = LLAMAD__REQUEST__OP_OPEN;
		q.open = &m_open;
	} else if (!strcmp(op, "append") && nargs == 3) {
		static const char *const roles[] = { "user", "system", "assistant", "raw" };
		m_app.session = a[0];
		m_app.has_role = 0;
		for (int k = 0; k < 4; k++)
			if (!strcmp(a[1], roles[k])) {
				m_app.has_role = 1;
				m_app.role = (Llamad__Role)k;  /* the wire's Role values */
			}
		if (!m_app.has_role)
			return usage();
		m_app.text = a[2];
		q.op_case = LLAMAD__REQUEST__OP_APPEND;
		q.append = &m_app;
	} else if (!strcmp(op, "list") && nargs == 0) {
		q.op_case = LLAMAD__REQUEST__OP_LIST;
		q.list = &m_list;
	} else if (!strcmp(op, "info") && nargs == 1) {
		m_info.session = a[0];
		q.op_case = LLAMAD__REQUEST__OP_INFO;
		q.info = &m_info;
	} else if (!strcmp(op, "drop") && nargs == 1) {
		m_drop.session = a[0];
		q.op_case = LLAMAD__REQUEST__OP_DROP;
		q.drop = &m_drop;
	} else if (!strcmp(op, "fork") && nargs == 2) {
		m_fork.session = a[0];
		m_fork.target = a[1];
		q.op_case = LLAMAD__REQUEST__OP_FORK;
		q.fork = &m_fork;
	} else if (!strcmp(op, "rewind") && nargs == 1) {
		m_rewind.session = a[0];
		q.op_case = LLAMAD__REQUEST__OP_REWIND;
		q.rewind = &m_rewind;
	} else if (!strcmp(op, "generate") && (nargs == 2 || nargs == 3)) {
		m_gen.session = a[0];
		m_gen.prompt = a[1];
		if (nargs == 3) {
			char *end;
			unsigned long n = strtoul(a[2], &end, 10);
			if (*end || end == a[2])
				return usage();
			m_gen.has_max_tokens = 1;
			m_gen.max_tokens = (uint32_t)n;
		}
		so.has_temperature = 1;
		so.temperature = 0;
		m_gen.sampler = &so;
		q.op_case = LLAMAD__REQUEST__OP_GENERATE;
		q.generate = &m_gen;
	} else if (!strcmp(op, "status") && nargs == 0) {
		q.op_case = LLAMAD__REQUEST__OP_STATUS;
		q.status = &m_status;
	} else {
		return usage();
	}

	int rc = 0;
	if (q.op_case == LLAMAD__REQUEST__OP_GENERATE) {
		/* open first (no create_only: an existing session is fine) */
		Llamad__Request o = LLAMAD__REQUEST__INIT;
		m_open.session = a[0];
		o.op_case = LLAMAD__REQUEST__OP_OPEN;
		o.open = &m_open;
		rc = call(fd, &o);
	}
	if (rc == 0)
		rc = call(fd, &q);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return usage();
	int fd = dial(argv[1]);
	if (fd < 0)
		return 2;
	int rc = 0;
	for (int i = 2; i < argc && rc != 2;) {
		int j = i;
		while (j < argc && strcmp(argv[j], "--"))
			j++;
		if (j == i) {
			rc = usage();
			break;
		}
		rc = run_op(fd, argv[i], j - i - 1, argv + i + 1);
		i = j + 1;
	}
	close(fd);
	return rc;
}
