/*
 * tests/fuzz/fuzz_head.c — gateway/reqscan.c, the gateway's framing of
 * HTTP requests, on any bytes. The first byte sets the head limit (small,
 * so that refusals are reached); the rest is a connection's input, fed
 * whole, then a byte at a time, then in pieces the input's own bytes size.
 * Each way must give the same events (kinds, statuses, body sizes), in a
 * well-formed order (a request starts, its head ends, it is done; nothing
 * after a refusal), every call reading no more than it was given, and a
 * body never over the limit.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/reqscan.h"

#define MAX_EV 4096

struct seen {
	size_t n;
	struct rs_event ev[MAX_EV];
};

static void run(const uint8_t *p, size_t n, size_t max_head, const uint8_t *steps, size_t n_steps,
		struct seen *out)
{
	struct rscan r;
	rscan_init(&r, max_head, 16, 1000);
	out->n = 0;
	size_t at = 0, k = 0;
	while (at < n) {
		size_t len = n - at;
		if (steps)
			len = 1 + (n_steps ? steps[k++ % n_steps] % 61 : 0);
		if (len > n - at)
			len = n - at;
		size_t off = 0;
		for (int guard = 0;; guard++) {
			struct rs_event ev;
			size_t got = rscan_feed(&r, (const char *)p + at + off, len - off, &ev);
			if (got > len - off)
				abort();
			off += got;
			if (ev.kind == RS_NONE) {
				if (off != len)
					abort();
				break;
			}
			if (guard > 3 * (int)len + 8)
				abort();   /* events without progress */
			if (out->n < MAX_EV)
				out->ev[out->n++] = ev;
		}
		at += len;
	}
}

static void check_order(const struct seen *s)
{
	int in = 0, head = 0, refused = 0;
	for (size_t i = 0; i < s->n; i++) {
		const struct rs_event *e = &s->ev[i];
		if (refused)
			abort();
		switch (e->kind) {
		case RS_START:
			if (in)
				abort();
			in = 1;
			head = 0;
			break;
		case RS_HEAD_END:
			if (!in || head)
				abort();
			head = 1;
			break;
		case RS_DONE:
			if (!in || !head || e->body_len > 1000)
				abort();
			in = 0;
			break;
		case RS_ERROR:
			if (!in || (e->status != 400 && e->status != 413 && e->status != 431) || !e->msg[0])
				abort();
			refused = 1;
			break;
		default:
			abort();
		}
	}
}

static int same(const struct seen *a, const struct seen *b)
{
	if (a->n != b->n)
		return 0;
	for (size_t i = 0; i < a->n; i++)
		if (a->ev[i].kind != b->ev[i].kind || a->ev[i].status != b->ev[i].status ||
		    (a->ev[i].kind == RS_DONE && a->ev[i].body_len != b->ev[i].body_len) ||
		    (a->ev[i].kind == RS_HEAD_END && a->ev[i].body != b->ev[i].body))
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t max_head = 64 + (size_t)data[0] * 4;
	static struct seen whole, bytes, pieces;
	run(data + 1, size - 1, max_head, NULL, 0, &whole);
	run(data + 1, size - 1, max_head, (const uint8_t *)"", 0, &bytes);
	run(data + 1, size - 1, max_head, data, size, &pieces);
	check_order(&whole);
	if (!same(&whole, &bytes) || !same(&whole, &pieces))
		abort();
	return 0;
}
