/*
 * gateway/reqscan.c — see reqscan.h. The rules mirrored are libevent
 * 2.1.12's (http.c: evhttp_parse_request_line, evhttp_get_body,
 * evhttp_get_body_length, evhttp_handle_chunked_read), so that a request
 * ends here where it ends there; where the two could differ (a
 * Content-Length line too long to keep, say), the request is refused.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "gateway/reqscan.h"

enum {
	RS_IDLE,                   /* between requests */
	RS_HEAD,                   /* the request line and headers */
	RS_FINISH,                 /* the head ended a request without a body */
	RS_BODY,                   /* Content-Length bytes */
	RS_CSIZE,                  /* a chunk's size line (or an empty line) */
	RS_CDATA,                  /* a chunk's bytes */
	RS_TRAILER,                /* lines after the last chunk */
	RS_REFUSED,
};

void rscan_init(struct rscan *r, size_t max_head, unsigned max_lines, uint64_t max_body)
{
	memset(r, 0, sizeof(*r));
	r->max_head = max_head;
	r->max_lines = max_lines;
	r->max_body = max_body;
	r->state = RS_IDLE;
}

static void start(struct rscan *r)
{
	size_t mh = r->max_head;
	unsigned ml = r->max_lines;
	uint64_t mb = r->max_body;
	rscan_init(r, mh, ml, mb);
	r->state = RS_HEAD;
	r->first = 1;
}

static void refuse(struct rscan *r, struct rs_event *ev, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void refuse(struct rscan *r, struct rs_event *ev, int status, const char *fmt, ...)
{
	ev->kind = RS_ERROR;
	ev->status = status;
	ev->ollama = r->ollama;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ev->msg, sizeof(ev->msg), fmt, ap);
	va_end(ap);
	r->state = RS_REFUSED;
}

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* strtoll(s, &end, base) as the C library reads s[0, n) (s holds no NUL
 * but may end early: n), saturating: *v, and the index of end; *neg. */
static size_t number(const char *s, size_t n, int base, uint64_t *v, int *neg)
{
	size_t i = 0;
	*v = 0;
	*neg = 0;
	while (i < n && is_space(s[i]))
		i++;
	if (i < n && (s[i] == '+' || s[i] == '-'))
		*neg = s[i++] == '-';
	if (base == 16 && i + 2 < n && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X') &&
	    hexval(s[i + 2]) >= 0)
		i += 2;
	size_t d0 = i;
	for (; i < n; i++) {
		int d = base == 16 ? hexval(s[i]) : (s[i] >= '0' && s[i] <= '9' ? s[i] - '0' : -1);
		if (d < 0)
			break;
		*v = *v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base ? UINT64_MAX : *v * (uint64_t)base + (uint64_t)d;
	}
	if (i == d0) {             /* no digits: nothing converted */
		*neg = 0;
		return 0;
	}
	if (*v > (uint64_t)INT64_MAX)
		*v = (uint64_t)INT64_MAX;
	return i;
}

/* A header line of the head (CR dropped, len its length, the first
 * RS_LINE_KEEP bytes in r->line). */
static void header(struct rscan *r, size_t len)
{
	const char *l = r->line;
	size_t kept = len < RS_LINE_KEEP ? len : RS_LINE_KEEP;
	if (l[0] == ' ' || l[0] == '\t') {
		r->folded = 1;   /* obs-fold: refused at the head's end */
		return;
	}
	const char *colon = memchr(l, ':', kept);
	if (!colon)
		return;   /* libevent refuses the head; nothing to mirror */
	size_t nl = (size_t)(colon - l);
	int is_len = nl == 14 && !strncasecmp(l, "Content-Length", 14);
	int is_te = nl == 17 && !strncasecmp(l, "Transfer-Encoding", 17);
	if (!is_len && !is_te)
		return;
	if ((is_len && r->have_len) || (is_te && r->have_te)) {
		r->twice = 1;
		return;
	}
	/* the value: spaces and tabs trimmed at both ends */
	size_t v = nl + 1;
	while (v < kept && (l[v] == ' ' || l[v] == '\t'))
		v++;
	size_t e = kept;
	while (e > v && (l[e - 1] == ' ' || l[e - 1] == '\t'))
		e--;
	if (is_len) {
		r->have_len = 1;
		uint64_t x = 0;
		size_t i = v;
		for (; i < e && l[i] >= '0' && l[i] <= '9'; i++)
			x = x > (UINT64_MAX - 9) / 10 ? UINT64_MAX : x * 10 + (uint64_t)(l[i] - '0');
		/* digits only, and a line kept whole */
		if (len > RS_LINE_KEEP || i == v || i != e)
			r->len_bad = 1;
		r->len = x;
	} else {
		r->have_te = 1;
		r->chunked = len <= RS_LINE_KEEP && e - v == 7 && !strncasecmp(l + v, "chunked", 7);
	}
}

/* The request line: the method (has it a body?) and the path's API. */
static void request_line(struct rscan *r, size_t len)
{
	size_t kept = len < RS_LINE_KEEP ? len : RS_LINE_KEEP;
	const char *sp = memchr(r->line, ' ', kept);
	size_t ml = sp ? (size_t)(sp - r->line) : kept;
	static const char *const with_body[] = { "GET", "POST", "PUT", "DELETE", "OPTIONS", "CONNECT",
						  "PATCH" };
	r->no_body = 1;
	for (size_t i = 0; i < sizeof(with_body) / sizeof(with_body[0]); i++)
		if (strlen(with_body[i]) == ml && !memcmp(r->line, with_body[i], ml))
			r->no_body = 0;
	if (sp && kept - (size_t)(sp + 1 - r->line) >= 5 && !memcmp(sp + 1, "/api/", 5))
		r->ollama = 1;
}

/* The head's empty line came: what follows it. Framings on which
 * libevent versions differ are refused: Debian's 2.1.12-stable-8+deb12u1
 * (request smuggling fixes) refuses Content-Length with
 * Transfer-Encoding and Content-Length twice, where 2.1.12 takes the
 * chunks or the first length; continuation lines (obs-fold, deprecated
 * by RFC 9112) and codings other than chunked are refused too. */
static void head_end(struct rscan *r, struct rs_event *ev)
{
	ev->kind = RS_HEAD_END;
	ev->ollama = r->ollama;
	ev->body = 0;
	if (r->no_body) {
		r->state = RS_FINISH;
	} else if (r->folded) {
		refuse(r, ev, 400, "a header line continues on the next (obs-fold): send each header "
		       "on one line");
	} else if (r->twice || (r->have_te && r->have_len)) {
		refuse(r, ev, 400, "Content-Length or Transfer-Encoding given twice, or both: the "
		       "body's length is ambiguous");
	} else if (r->have_te && !r->chunked) {
		refuse(r, ev, 400, "Transfer-Encoding: only chunked is taken");
	} else if (r->have_te) {
		ev->body = 2;
		r->state = RS_CSIZE;
	} else if (r->have_len && r->len_bad) {
		refuse(r, ev, 400, "Content-Length is not a number of bytes");
	} else if (r->have_len && r->len > 0) {
		if (r->len > r->max_body) {
			refuse(r, ev, 413, "the request body (%llu bytes) is over the limit of %llu bytes "
			       "(--max-body)", (unsigned long long)r->len, (unsigned long long)r->max_body);
			return;
		}
		ev->body = 1;
		ev->body_len = r->len;
		r->left = r->len;
		r->state = RS_BODY;
	} else {
		r->state = RS_FINISH;
	}
}

/* A chunk's size line (len bytes, CR dropped). */
static void chunk_size(struct rscan *r, size_t len, struct rs_event *ev)
{
	if (len == 0)
		return;   /* the CRLF after a chunk's bytes */
	if (len > RS_LINE_KEEP) {
		refuse(r, ev, 400, "a chunk size line is over %d bytes", RS_LINE_KEEP);
		return;
	}
	uint64_t x;
	int neg;
	size_t end = number(r->line, len, 16, &x, &neg);
	if ((end < len && r->line[end] != ' ') || (neg && x)) {
		refuse(r, ev, 400, "a chunk size is not a hexadecimal number");
		return;
	}
	if (x == 0) {
		r->state = RS_TRAILER;
		return;
	}
	if (x > r->max_body - r->body_bytes) {
		refuse(r, ev, 413, "the request body (over %llu bytes) is over the limit of %llu bytes "
		       "(--max-body)", (unsigned long long)r->max_body, (unsigned long long)r->max_body);
		return;
	}
	r->body_bytes += x;
	r->left = x;
	r->state = RS_CDATA;
}

/* One byte of a line (head, chunk size, trailer): 1 if an event came. */
static int line_byte(struct rscan *r, char c, struct rs_event *ev)
{
	int head = r->state == RS_HEAD || r->state == RS_TRAILER;
	if (head && ++r->head_bytes > r->max_head) {
		refuse(r, ev, 431, "the request head is over %zu bytes (--max-header-size)", r->max_head);
		return 1;
	}
	if (c == 0) {
		refuse(r, ev, 400, "a NUL byte in the request %s", head ? "head" : "body's chunk sizes");
		return 1;
	}
	if (c != '\n') {
		if (r->line_len < RS_LINE_KEEP)
			r->line[r->line_len] = c;
		r->line_len++;
		r->cr = c == '\r';
		if (r->state == RS_CSIZE && r->line_len > RS_LINE_KEEP + 1) {
			refuse(r, ev, 400, "a chunk size line is over %d bytes", RS_LINE_KEEP);
			return 1;
		}
		return 0;
	}
	size_t len = r->line_len;
	if (r->cr)
		len--;   /* CR LF */
	r->line_len = 0;
	r->cr = 0;
	switch (r->state) {
	case RS_HEAD:
		if (r->first) {
			r->first = 0;
			request_line(r, len);
			return 0;
		}
		if (len == 0) {
			head_end(r, ev);
			return 1;
		}
		if (++r->lines > r->max_lines) {
			refuse(r, ev, 431, "the request head has over %u header lines", r->max_lines);
			return 1;
		}
		header(r, len);
		return 0;
	case RS_CSIZE:
		chunk_size(r, len, ev);
		return ev->kind != RS_NONE;
	case RS_TRAILER:
		if (len == 0) {
			r->state = RS_IDLE;
			ev->kind = RS_DONE;
			ev->body_len = r->body_bytes;
			return 1;
		}
		if (++r->lines > r->max_lines) {
			refuse(r, ev, 431, "the request head has over %u header lines", r->max_lines);
			return 1;
		}
		return 0;
	}
	return 0;
}

size_t rscan_feed(struct rscan *r, const char *p, size_t n, struct rs_event *ev)
{
	memset(ev, 0, sizeof(*ev));
	ev->kind = RS_NONE;
	size_t i = 0;
	for (;;) {
		ev->ollama = r->ollama;
		switch (r->state) {
		case RS_REFUSED:
			return n;
		case RS_FINISH:
			r->state = RS_IDLE;
			ev->kind = RS_DONE;
			return i;
		case RS_IDLE:
			if (i == n)
				return i;
			start(r);
			ev->kind = RS_START;
			return i;
		case RS_BODY:
		case RS_CDATA: {
			uint64_t take = n - i < r->left ? n - i : r->left;
			i += (size_t)take;
			r->left -= take;
			if (r->left == 0 && r->state == RS_BODY) {
				r->state = RS_IDLE;
				ev->kind = RS_DONE;
				ev->body_len = r->len;
				return i;
			}
			if (r->left == 0)
				r->state = RS_CSIZE;
			if (i == n)
				return i;
			break;
		}
		default:
			if (i == n)
				return i;
			if (line_byte(r, p[i++], ev)) {
				if (ev->kind == RS_ERROR)
					return n;
				return i;
			}
		}
	}
}
