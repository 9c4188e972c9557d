/*
 * tests/unit/test_reqscan.c — gateway/reqscan.c, the gateway's framing of
 * HTTP requests ahead of libevent: the limits and refusals case by case,
 * and, against libevent 2.1's own server in this process, the same
 * request boundaries and body sizes for thousands of random pipelined
 * streams (Content-Length and chunked bodies, methods without bodies,
 * LF and CRLF lines, continuation lines, trailers, empty lines between
 * chunks), fed in random pieces.
 */
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "gateway/reqscan.h"

/* Feed s in pieces of `step` bytes (0: whole); the events in order as
 * letters (S start, H head end, D done, E error) into out; the last
 * error's status and message in *status, msg. */
static void scan(struct rscan *r, const char *s, size_t n, size_t step, char *out, size_t cap,
		 int *status, char *msg)
{
	size_t k = 0;
	*status = 0;
	for (size_t at = 0; at < n || at == 0;) {
		size_t len = step && n - at > step ? step : n - at;
		size_t off = 0;
		for (;;) {
			struct rs_event ev;
			off += rscan_feed(r, s + at + off, len - off, &ev);
			if (ev.kind == RS_NONE)
				break;
			if (k + 1 < cap)
				out[k++] = "-SHDE"[ev.kind];
			if (ev.kind == RS_ERROR) {
				*status = ev.status;
				snprintf(msg, 160, "%s", ev.msg);
			}
		}
		assert_int_equal(off, len);
		at += len;
		if (n == 0)
			break;
	}
	out[k] = 0;
}

#define expect(lit, ...) expect_n(lit, sizeof(lit) - 1, __VA_ARGS__)
static void expect_n(const char *s, size_t n, size_t max_head, uint64_t max_body, const char *want,
		     int status, const char *msg_part)
{
	/* whole, byte by byte and in 7-byte pieces: the same events */
	const size_t steps[] = { 0, 1, 7 };
	for (size_t i = 0; i < 3; i++) {
		struct rscan r;
		rscan_init(&r, max_head, 8, max_body);
		char got[64], msg[160] = "";
		int st;
		scan(&r, s, n, steps[i], got, sizeof(got), &st, msg);
		if (strcmp(got, want) || st != status || (msg_part && !strstr(msg, msg_part)))
			fail_msg("step %zu: \"%s\": events %s status %d (%s); wanted %s %d (%s)", steps[i], s,
				 got, st, msg, want, status, msg_part ? msg_part : "");
	}
}

static void test_cases(void **state)
{
	(void)state;
	expect("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1024, 100, "SHD", 0, NULL);
	expect("GET / HTTP/1.1\nHost: x\n\n", 1024, 100, "SHD", 0, NULL);
	/* pipelined */
	expect("GET / HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n", 1024, 100, "SHDSHD", 0, NULL);
	/* a body, then the next request */
	expect("POST /v1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n", 1024, 100,
	       "SHDSHD", 0, NULL);
	expect("POST /v1 HTTP/1.1\r\ncontent-length:   3 \t\r\n\r\nabc", 1024, 100, "SHD", 0, NULL);
	/* HEAD has no body; its Content-Length is not one */
	expect("HEAD / HTTP/1.1\r\nContent-Length: 5\r\n\r\nGET / HTTP/1.1\r\n\r\n", 1024, 100,
	       "SHDSHD", 0, NULL);
	/* chunked: empty lines between chunks, a size with an extension
	 * after a space, 0x, a trailer */
	expect("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked \r\n\r\n"
	       "3\r\nabc\r\n\r\n0x2 ext\r\nde\r\n0\r\nX-T: 1\r\n\r\n", 1024, 100, "SHD", 0, NULL);
	/* ambiguous framings: refused */
	expect("POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\nab", 1024, 100, "SE",
	       400, "ambiguous");
	expect("POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 1024, 100,
	       "SE", 400, "ambiguous");
	expect("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
	       1024, 100, "SE", 400, "ambiguous");
	expect("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 1024, 100, "SE", 400,
	       "only chunked");
	expect("POST / HTTP/1.1\r\nX-A: 1\r\n  more\r\n\r\n", 1024, 100, "SE", 400, "obs-fold");
	expect("POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", 1024, 100, "SE", 400,
	       "Content-Length");
	/* refusals */
	expect("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 1024, 100, "SE", 413, "101 bytes");
	expect("POST /api/chat HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 1024, 100, "SE", 400,
	       "Content-Length");
	expect("GET / HTTP/1.1\r\nX-A: 123456789012345678901234567890\r\n\r\n", 40, 100, "SE", 431,
	       "over 40 bytes");
	expect("GET / HTTP/1.1\r\nAuthorization: Bearer abc\0junk\r\n\r\n", 1024, 100, "SE", 400, "NUL");
	expect("GET / HTTP/1.1\r\na:1\r\nb:1\r\nc:1\r\nd:1\r\ne:1\r\nf:1\r\ng:1\r\nh:1\r\ni:1\r\n\r\n", 1024,
	       100, "SE", 431, "8 header lines");
	expect("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n60\r\n", 1024, 100, "SH", 0, NULL);
	expect("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n", 1024, 100, "SHE", 413,
	       "--max-body");
	expect("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\n\r\n", 1024, 100,
	       "SHE", 400, "hexadecimal");
	/* nothing after the refusal is read */
	expect("POST / HTTP/1.1\r\nContent-Length: 500\r\n\r\nGET / HTTP/1.1\r\n\r\n", 1024, 100, "SE",
	       413, NULL);
}

static void test_nul_message_names_head(void **state)
{
	(void)state;
	const char s[] = "GET / HTTP/1.1\r\nX: a\0\r\n\r\n";
	struct rscan r;
	rscan_init(&r, 1024, 8, 100);
	char got[16], msg[160];
	int st;
	scan(&r, s, sizeof(s) - 1, 0, got, sizeof(got), &st, msg);
	assert_int_equal(st, 400);
	assert_string_equal(msg, "a NUL byte in the request head");
	/* refused: what follows is read whole, and nothing is said of it */
	struct rs_event ev;
	assert_int_equal(rscan_feed(&r, "GET / HTTP/1.1\r\n\r\n", 18, &ev), 18);
	assert_int_equal(ev.kind, RS_NONE);
}

/* A head of 32 MiB refused after max_head bytes: the work is linear. */
static void test_huge_header_line(void **state)
{
	(void)state;
	size_t n = 32u << 20;
	char *s = malloc(n);
	assert_non_null(s);
	memcpy(s, "GET / HTTP/1.1\r\nX-Big: ", 23);
	memset(s + 23, 'a', n - 23);
	struct rscan r;
	rscan_init(&r, 32768, 100, 1 << 20);
	size_t off = 0, events = 0;
	int status = 0;
	while (off < n) {
		size_t len = n - off > 16384 ? 16384 : n - off;
		size_t got = 0;
		for (;;) {
			struct rs_event ev;
			got += rscan_feed(&r, s + off + got, len - got, &ev);
			if (ev.kind == RS_NONE)
				break;
			events++;
			if (ev.kind == RS_ERROR)
				status = ev.status;
		}
		off += len;
	}
	free(s);
	assert_int_equal(status, 431);
	assert_int_equal(events, 2);   /* start, refusal */
}

/* ---- against libevent ----------------------------------------------------- */

struct seen {
	size_t n;
	uint64_t body[256];
	int cmd[256];
};

static void on_request(struct evhttp_request *req, void *arg)
{
	struct seen *s = arg;
	if (s->n < 256) {
		s->body[s->n] = evbuffer_get_length(evhttp_request_get_input_buffer(req));
		s->cmd[s->n] = evhttp_request_get_command(req);
	}
	s->n++;
	evhttp_send_reply(req, 200, "OK", NULL);
}

static uint32_t rnd_state = 12345;
static uint32_t rnd(uint32_t n)
{
	rnd_state = rnd_state * 1103515245u + 12345u;
	return (rnd_state >> 8) % n;
}

/* A random request appended to b; its body's size in *body. */
static void random_request(struct evbuffer *b, uint64_t *body)
{
	static const char *const methods[] = { "GET", "POST", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS" };
	const char *m = methods[rnd(7)];
	const char *eol = rnd(4) ? "\r\n" : "\n";
	evbuffer_add_printf(b, "%s /x%u HTTP/1.1%sHost: h%s", m, rnd(100), eol, eol);
	int has_body = strcmp(m, "HEAD") != 0;
	int kind = rnd(3);   /* 0 none, 1 Content-Length, 2 chunked */
	*body = 0;
	if (rnd(3) == 0)
		evbuffer_add_printf(b, "X-Other: a b%s", eol);
	if (kind == 1) {
		uint64_t n = rnd(40);
		evbuffer_add_printf(b, "%s: %s%llu%s", rnd(2) ? "Content-Length" : "content-length",
				    rnd(4) ? "" : "  ", (unsigned long long)n, eol);
		evbuffer_add_printf(b, "%s", eol);
		if (has_body) {
			for (uint64_t i = 0; i < n; i++)
				evbuffer_add(b, "0123456789\n\r"  + rnd(12), 1);
			*body = n;
		}
		return;
	}
	if (kind == 2) {
		evbuffer_add_printf(b, "Transfer-Encoding: %s%s", rnd(2) ? "chunked" : "CHUNKED", eol);
		evbuffer_add_printf(b, "%s", eol);
		if (!has_body)
			return;
		int chunks = (int)rnd(4);
		for (int c = 0; c < chunks; c++) {
			uint32_t n = 1 + rnd(20);
			evbuffer_add_printf(b, "%s%x%s%s", rnd(3) ? "" : "0x", n, rnd(4) ? "" : " ext", eol);
			for (uint32_t i = 0; i < n; i++)
				evbuffer_add(b, "abc\r\n" + rnd(5), 1);
			evbuffer_add_printf(b, "%s", eol);
			if (rnd(4) == 0)
				evbuffer_add_printf(b, "%s", eol);
			*body += n;
		}
		evbuffer_add_printf(b, "0%s", eol);
		if (rnd(2))
			evbuffer_add_printf(b, "X-Trailer: t%s", eol);
		evbuffer_add_printf(b, "%s", eol);
		return;
	}
	evbuffer_add_printf(b, "%s", eol);
}

static void test_against_libevent(void **state)
{
	(void)state;
	struct event_base *base = event_base_new();
	assert_non_null(base);
	struct evhttp *http = evhttp_new(base);
	assert_non_null(http);
	evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
				   EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
	struct seen seen;
	evhttp_set_gencb(http, on_request, &seen);
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(ls, 16), 0);
	assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &al), 0);
	evutil_make_socket_nonblocking(ls);
	assert_non_null(evhttp_accept_socket_with_handle(http, ls));
	int streams = 0, requests = 0;
	for (int round = 0; round < 400; round++) {
		int c = socket(AF_INET, SOCK_STREAM, 0);
		assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);

		struct evbuffer *s = evbuffer_new();
		int n_req = 1 + (int)rnd(6);
		uint64_t bodies[8];
		for (int i = 0; i < n_req; i++)
			random_request(s, &bodies[i]);
		size_t len = evbuffer_get_length(s);
		const char *p = (const char *)evbuffer_pullup(s, -1);
		/* the scanner, in random pieces */
		struct rscan r;
		rscan_init(&r, 1 << 16, 100, 1 << 20);
		int done = 0, errors = 0;
		uint64_t scanned[8];
		for (size_t at = 0; at < len;) {
			size_t k = 1 + rnd(64);
			if (k > len - at)
				k = len - at;
			size_t off = 0;
			for (;;) {
				struct rs_event ev;
				off += rscan_feed(&r, p + at + off, k - off, &ev);
				if (ev.kind == RS_NONE)
					break;
				if (ev.kind == RS_DONE && done < 8)
					scanned[done] = ev.body_len;
				done += ev.kind == RS_DONE;
				errors += ev.kind == RS_ERROR;
			}
			at += k;
		}
		assert_int_equal(errors, 0);
		assert_int_equal(done, n_req);
		/* libevent, the same bytes */
		memset(&seen, 0, sizeof(seen));
		/* not shut down: libevent drops what it buffered behind an EOF */
		assert_int_equal(write(c, p, len), (ssize_t)len);
		struct timeval tv = { 0, 1000 };
		for (int spin = 0; spin < 4000 && seen.n < (size_t)n_req; spin++)
			event_base_loopexit(base, &tv), event_base_dispatch(base);
		if (seen.n != (size_t)n_req)
			fail_msg("round %d: libevent saw %zu requests, the scanner %d:\n%.*s", round, seen.n,
				 n_req, (int)len, p);
		for (int i = 0; i < n_req; i++)
			if (seen.body[i] != bodies[i] || scanned[i] != bodies[i])
				fail_msg("round %d request %d: libevent read a body of %llu bytes, the scanner "
					 "%llu, sent %llu", round, i, (unsigned long long)seen.body[i],
					 (unsigned long long)scanned[i], (unsigned long long)bodies[i]);
		close(c);
		evbuffer_free(s);
		streams++;
		requests += n_req;
	}
	evhttp_free(http);
	event_base_free(base);
	print_message("%d streams, %d requests: the same boundaries\n", streams, requests);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cases),
		cmocka_unit_test(test_nul_message_names_head),
		cmocka_unit_test(test_huge_header_line),
		cmocka_unit_test(test_against_libevent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
