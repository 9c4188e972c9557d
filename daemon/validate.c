/*
 * daemon/validate.c — request validation, split from server.c so that it
 * builds without libevent (the fuzzer links it alone).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "daemon/validate.h"
#include "proto/limits.h"
#include "session/session.h"
#include "util/utf8.h"

/* A message that names a size and its limit: formatted into one buffer
 * per thread, valid until the next call (the caller sends it first). */
static const char *say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *say(const char *fmt, ...)
{
	static _Thread_local char msg[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return msg;
}

static int text_ok(const char *t, uint32_t max, const char **why)
{
	if (!t)
		return 1;
	size_t n = strlen(t);
	if (n > max) {
		*why = say("text is %zu bytes, more than max_text (%u)", n, max);
		return 0;
	}
	if (!utf8_valid(t, n)) {
		*why = "text is not valid UTF-8";
		return 0;
	}
	return 1;
}

/* A varint at p[*i, n): 0 with its value in *v (the low 64 bits, as
 * protobuf-c reads it), *i moved past it; -1 if cut or over 10 bytes. */
static int varint_u64(const uint8_t *p, size_t n, size_t *i, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; *i < n && shift < 70; shift += 7) {
		uint8_t b = p[(*i)++];
		*v |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 0);
		if (!(b & 0x80))
			return 0;
	}
	return -1;
}

/* The same as a length or a tag: its value without the top bit, or -1. */
static int64_t varint(const uint8_t *p, size_t n, size_t *i)
{
	uint64_t v;
	return varint_u64(p, n, i, &v) ? -1 : (int64_t)(v & INT64_MAX);
}

/* What a walk of the wire bytes found (request_scan). */
struct scan {
	int nul;                 /* a string field holds a NUL byte */
	size_t longest;          /* the longest string field's bytes */
	uint64_t id;             /* Request.id, when the top level has it */
	size_t unknown_fields, unknown_bytes;
	size_t strings;          /* string, bytes and message fields: each one an
				  * allocation once unpacked */
};

/* Walk message d in p[0, n): string fields holding a NUL byte, and fields
 * the descriptor does not know (protobuf-c keeps each one, at some 80
 * bytes of memory apiece: a frame of them costs far more than its size). */
static void walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth,
		 struct scan *sc)
{
	size_t i = 0;
	while (i < n) {
		size_t at = i;
		int64_t tag = varint(p, n, &i);
		if (tag < 0)
			return;
		const ProtobufCFieldDescriptor *f =
			tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3))
					       : NULL;
		int64_t len = 0;
		switch (tag & 7) {
		case 0: {
			uint64_t v;
			if (varint_u64(p, n, &i, &v))
				return;
			if (depth == 0 && tag >> 3 == 1)
				sc->id = v;
			break;
		}
		case 1:
			i += 8;
			break;
		case 5:
			i += 4;
			break;
		case 2:
			len = varint(p, n, &i);
			if (len < 0 || (uint64_t)len > n - i)
				return;
			break;
		default:
			return;   /* groups: the unpacker refuses them */
		}
		if (!f) {
			sc->unknown_fields++;
			sc->unknown_bytes += (i > n ? n : i) - at + (size_t)len;
		} else if ((tag & 7) == 2 && f->type == PROTOBUF_C_TYPE_STRING) {
			sc->strings++;
			sc->nul |= memchr(p + i, 0, (size_t)len) != NULL;
			if ((size_t)len > sc->longest)
				sc->longest = (size_t)len;
		} else if ((tag & 7) == 2 && f->type == PROTOBUF_C_TYPE_MESSAGE) {
			sc->strings++;
			if (depth < 8)
				walk(f->descriptor, p + i, (size_t)len, depth + 1, sc);
		} else if ((tag & 7) == 2 && f->type == PROTOBUF_C_TYPE_BYTES) {
			sc->strings++;
		}
		i += (size_t)len;
	}
}

int request_scan(const uint8_t *body, size_t len, uint32_t max_text, uint64_t *id,
		 const char **why)
{
	struct scan sc = { 0 };
	walk(&llamad__request__descriptor, body, len, 0, &sc);
	*id = sc.id;
	if (sc.longest > max_text) {
		*why = say("text is %zu bytes, more than max_text (%u)", sc.longest, max_text);
		return -E2BIG;
	}
	if (sc.unknown_fields > REQUEST_UNKNOWN_FIELDS) {
		*why = say("%zu unknown fields (%zu bytes) in one request, more than %d: not read",
			   sc.unknown_fields, sc.unknown_bytes, REQUEST_UNKNOWN_FIELDS);
		return -E2BIG;
	}
	if (sc.strings > REQUEST_STRINGS) {
		*why = say("%zu string and message fields in one request, more than %d: not read",
			   sc.strings, REQUEST_STRINGS);
		return -E2BIG;
	}
	if (sc.nul) {
		*why = "a text field holds a NUL byte";
		return -EINVAL;
	}
	return 0;
}

/* Every enum field present in m (at any depth, repeated ones included)
 * holds one of its enum's values, as the descriptors name them: the one
 * table of what the wire may carry. protobuf-c takes any int32 for a
 * proto2 enum, and the C enums are unsigned to the compiler, so a
 * template of -1 would pass a range check written by hand. 1, or 0 with
 * *why naming the field and the value. */
static int enums_ok(const ProtobufCMessage *m, int depth, const char **why)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_ENUM && f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		size_t n = 1;
		const void *at = base + f->offset;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			n = *(const size_t *)(base + f->quantifier_offset);
			at = *(void *const *)at;
		} else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
				continue;
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type == PROTOBUF_C_TYPE_ENUM &&
			   !*(const protobuf_c_boolean *)(base + f->quantifier_offset)) {
			continue;
		}
		for (size_t k = 0; k < n; k++) {
			if (f->type == PROTOBUF_C_TYPE_ENUM) {
				int v = ((const int *)at)[k];
				if (protobuf_c_enum_descriptor_get_value(f->descriptor, v))
					continue;
				*why = say("%s.%s: %d is not a %s value", d->short_name, f->name, v,
					   ((const ProtobufCEnumDescriptor *)f->descriptor)->short_name);
				return 0;
			}
			const ProtobufCMessage *sub = ((const ProtobufCMessage *const *)at)[k];
			if (sub && depth < 8 && !enums_ok(sub, depth + 1, why))
				return 0;
		}
	}
	return 1;
}

static int id_ok(const char *id)
{
	return id && sess_id_valid(id);
}

/* Check a request before it reaches the engine (contract in validate.h). */
int request_validate(const Llamad__Request *q, uint32_t max_text, const char **why)
{
	uint32_t mt = max_text;
	int bad = -EINVAL, big = -E2BIG;
	const char *bad_id = LLAMAD_SESSION_ID_RULE;
	if (!enums_ok(&q->base, 0, why))
		return bad;
	switch (q->op_case) {
	case LLAMAD__REQUEST__OP_HELLO:
		if (q->hello->client && strlen(q->hello->client) > 256)
			return (*why = say("client name is %zu bytes, more than 256",
					   strlen(q->hello->client)), big);
		if (!text_ok(q->hello->client, 256, why))
			return bad;
		if (q->hello->caller && strlen(q->hello->caller) > 256)
			return (*why = say("caller is %zu bytes, more than 256",
					   strlen(q->hello->caller)), big);
		if (!text_ok(q->hello->caller, 256, why))
			return bad;
		return 0;
	case LLAMAD__REQUEST__OP_OPEN: {
		const Llamad__OpenSession *o = q->open;
		if (!id_ok(o->session))
			return (*why = bad_id, bad);
		if (!text_ok(o->system, mt, why))
			return strlen(o->system) > mt ? big : bad;
		return 0;
	}
	case LLAMAD__REQUEST__OP_APPEND: {
		const Llamad__Append *a = q->append;
		if (!id_ok(a->session))
			return (*why = bad_id, bad);
		if (!a->text || !*a->text)
			return (*why = "append needs a text (an empty turn adds nothing)", bad);
		if (!text_ok(a->text, mt, why))
			return strlen(a->text) > mt ? big : bad;
		return 0;
	}
	case LLAMAD__REQUEST__OP_GENERATE: {
		const Llamad__Generate *g = q->generate;
		if (!id_ok(g->session))
			return (*why = bad_id, bad);
		if (!text_ok(g->prompt, mt, why))
			return strlen(g->prompt) > mt ? big : bad;
		if (g->has_max_tokens && g->max_tokens > MAX_GEN_TOKENS)
			return (*why = say("max_tokens %u is more than %u", g->max_tokens,
					   MAX_GEN_TOKENS), big);
		size_t n_stop = 0;   /* empty ones are ignored, and not counted */
		if (g->n_stop > LLAMAD_MAX_STOP_ENTRIES)
			return (*why = say("%zu stop entries, more than %d (empty ones included)",
					   g->n_stop, LLAMAD_MAX_STOP_ENTRIES), big);
		for (size_t i = 0; i < g->n_stop; i++)
			n_stop += g->stop[i] && *g->stop[i];
		if (n_stop > LLAMAD_MAX_STOPS)
			return (*why = say("%zu stop strings, more than %d", n_stop,
					   LLAMAD_MAX_STOPS), big);
		for (size_t i = 0; i < g->n_stop; i++) {
			if (g->stop[i] && strlen(g->stop[i]) > LLAMAD_MAX_STOP_LEN)
				return (*why = say("a stop string is %zu bytes, more than %d",
						   strlen(g->stop[i]), LLAMAD_MAX_STOP_LEN), big);
			if (!text_ok(g->stop[i], LLAMAD_MAX_STOP_LEN, why))
				return bad;
		}
		return 0;
	}
	case LLAMAD__REQUEST__OP_FORK:
		if (!id_ok(q->fork->session) || !id_ok(q->fork->target))
			return (*why = bad_id, bad);
		return 0;
	case LLAMAD__REQUEST__OP_DROP:
		return id_ok(q->drop->session) ? 0 : (*why = bad_id, bad);
	case LLAMAD__REQUEST__OP_INFO:
		return id_ok(q->info->session) ? 0 : (*why = bad_id, bad);
	case LLAMAD__REQUEST__OP_REWIND:
		return id_ok(q->rewind->session) ? 0 : (*why = bad_id, bad);
	case LLAMAD__REQUEST__OP_TRANSCRIPT:
		return id_ok(q->transcript->session) ? 0 : (*why = bad_id, bad);
	case LLAMAD__REQUEST__OP_TOKENIZE:
		if (!text_ok(q->tokenize->text, mt, why))
			return strlen(q->tokenize->text) > mt ? big : bad;
		return 0;
	case LLAMAD__REQUEST__OP_DETOKENIZE:
		if (q->detokenize->n_tokens > mt)
			return (*why = say("%zu tokens, more than max_text (%u)",
					   q->detokenize->n_tokens, mt), big);
		return 0;
	case LLAMAD__REQUEST__OP_SAVE:
		if (!q->save->all && !id_ok(q->save->session))
			return (*why = bad_id, bad);
		return 0;
	case LLAMAD__REQUEST__OP_CANCEL:
		if (q->cancel->session && q->cancel->has_request_id)
			return (*why = "Cancel names a request_id or a session, not both", bad);
		if (q->cancel->session && !id_ok(q->cancel->session))
			return (*why = bad_id, bad);
		return 0;
	case LLAMAD__REQUEST__OP_LIST:
		if (q->list->after && strlen(q->list->after) > LLAMAD_SESSION_ID_MAX + 16)
			return (*why = "a ListSessions cursor is a SessionList.next", bad);
		return text_ok(q->list->after, LLAMAD_SESSION_ID_MAX + 16, why) ? 0 : bad;
	case LLAMAD__REQUEST__OP_STATUS:
		return 0;
	default:
		*why = "unknown operation";
		return -ENOSYS;
	}
}
