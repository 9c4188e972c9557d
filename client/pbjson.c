/*
 * client/pbjson.c — see pbjson.h.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/enums.h"
#include "client/pbjson.h"
#include "proto/names.h"

enum {
	PBJ_SKIP = 1,         /* never written */
	PBJ_OMIT_UNSET = 2,   /* written only when set (repeated: when not empty) */
	PBJ_NULL_UNSET = 4,   /* null when not set */
	PBJ_EMPTY_UNSET = 8,  /* a string: "" when not set */
	PBJ_ROUND3 = 16,      /* a number rounded to 3 decimals (timings: µs) */
};

/* A form chosen on purpose for one field of one message ("*": every field
 * of it that has no row of its own). With `after`, the field is written
 * right after that one instead of in field-number order (rows apply in
 * this order, so one may follow another that moved). */
struct rule {
	const ProtobufCMessageDescriptor *msg;
	const char *field;
	unsigned flags;
	const char *after;
};

static const struct rule rules[] = {
	/* a stream of text: an event without text has "" */
	{ &llamad__token_event__descriptor, "text", PBJ_EMPTY_UNSET, NULL },
	{ &llamad__done__descriptor, "prefill_ms", PBJ_ROUND3, NULL },
	{ &llamad__done__descriptor, "generate_ms", PBJ_ROUND3, NULL },
	/* what a shift removed: absent from a daemon that does not say */
	{ &llamad__done__descriptor, "dropped_turns", PBJ_OMIT_UNSET, NULL },
	{ &llamad__done__descriptor, "dropped_tokens", PBJ_OMIT_UNSET, NULL },
	{ &llamad__done__descriptor, "slid_tokens", PBJ_OMIT_UNSET, NULL },
	/* prompt tokens taken from shared blocks: beside the prefilled ones,
	 * absent from a daemon that does not say */
	{ &llamad__done__descriptor, "shared_tokens", PBJ_OMIT_UNSET, "prompt_tokens" },
	/* what an open or an append said: only when it said it, at the end */
	{ &llamad__session_info__descriptor, "created", PBJ_OMIT_UNSET, "file_bytes" },
	{ &llamad__session_info__descriptor, "tokens_added", PBJ_OMIT_UNSET, "created" },
	{ &llamad__session_info__descriptor, "computed_tokens", PBJ_OMIT_UNSET, "tokens_added" },
	{ &llamad__session_info__descriptor, "dropped_turns", PBJ_OMIT_UNSET, "computed_tokens" },
	/* the prompt an answer saw: absent from a daemon that does not say */
	{ &llamad__done__descriptor, "context_tokens", PBJ_OMIT_UNSET, "session_tokens" },
	/* show --transcript writes the items of every page itself, last */
	{ &llamad__transcript__descriptor, "next", PBJ_SKIP, NULL },
	{ &llamad__transcript__descriptor, "items", PBJ_SKIP, NULL },
	{ &llamad__transcript__descriptor, "system", 0, "location" },
	{ &llamad__turn__descriptor, "text", PBJ_EMPTY_UNSET, NULL },
	{ &llamad__turn__descriptor, "stop_reason", PBJ_NULL_UNSET, NULL },
	{ &llamad__turn__descriptor, "token_ids", PBJ_OMIT_UNSET, "truncated" },
	/* what a shift removed: only when something was (or said) */
	{ &llamad__turn__descriptor, "slid_tokens", PBJ_OMIT_UNSET, NULL },
	{ &llamad__transcript__descriptor, "dropped_turns", PBJ_OMIT_UNSET, NULL },
	{ &llamad__transcript__descriptor, "dropped_tokens", PBJ_OMIT_UNSET, NULL },
	{ &llamad__status__descriptor, "uptime_s", PBJ_ROUND3, NULL },
	{ &llamad__status__descriptor, "chat_template", 0, "state_dir" },
	{ &llamad__status__descriptor, "sessions_in_ram", 0, "chat_template" },
	{ &llamad__status__descriptor, "sessions_on_disk", 0, "sessions_in_ram" },
	{ &llamad__status__descriptor, "counters", 0, "ram_bytes_total" },
	/* the free blocks that hold prefixes, with the other counts of blocks;
	 * whether sharing is on: null from a daemon that does not say */
	{ &llamad__status__descriptor, "kv_blocks_cached", PBJ_NULL_UNSET, "kv_blocks_free" },
	{ &llamad__status__descriptor, "prefix_sharing", PBJ_NULL_UNSET, NULL },
	/* what counts other users' work is not sent to a user other than root
	 * and the daemon's own (Status.own, then present and true): null */
	{ &llamad__status__descriptor, "connections", PBJ_NULL_UNSET, NULL },
	{ &llamad__status__descriptor, "kv_blocks_free", PBJ_NULL_UNSET, NULL },
	{ &llamad__status__descriptor, "ram_bytes_used", PBJ_NULL_UNSET, NULL },
	{ &llamad__status__descriptor, "rss_bytes", PBJ_NULL_UNSET, NULL },
	{ &llamad__counters__descriptor, "*", PBJ_NULL_UNSET, NULL },
	{ &llamad__status__descriptor, "own", PBJ_OMIT_UNSET, NULL },
	/* the saved sessions' bytes: null without a state directory */
	{ &llamad__status__descriptor, "disk_bytes", PBJ_NULL_UNSET, NULL },
	{ &llamad__status__descriptor, "disk_quota_bytes", PBJ_NULL_UNSET, NULL },
	/* the latency histograms: absent from a daemon that does not keep them */
	{ &llamad__status__descriptor, "ttft", PBJ_OMIT_UNSET, NULL },
	{ &llamad__status__descriptor, "token_time", PBJ_OMIT_UNSET, NULL },
};

#define N_RULES (sizeof(rules) / sizeof(rules[0]))

static const struct rule *rule_of(const ProtobufCMessageDescriptor *d, const char *field)
{
	const struct rule *all = NULL;
	for (size_t i = 0; i < N_RULES; i++) {
		if (rules[i].msg != d)
			continue;
		if (strcmp(rules[i].field, field) == 0)
			return &rules[i];
		if (strcmp(rules[i].field, "*") == 0)
			all = &rules[i];
	}
	return all;
}

/* Whether field f of m is set: has_ for optional scalars and bytes, a
 * pointer for strings and messages, the case for a oneof member, a count
 * for a repeated field; a required field always. */
static bool is_set(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
	const char *base = (const char *)m;
	if (f->label == PROTOBUF_C_LABEL_REPEATED)
		return *(const size_t *)(base + f->quantifier_offset) > 0;
	if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
		return *(const uint32_t *)(base + f->quantifier_offset) == f->id;
	if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)
		return *(const void *const *)(base + f->offset) != NULL;
	if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
		return *(const protobuf_c_boolean *)(base + f->quantifier_offset);
	return true;
}

static void enum_value(struct json *j, const ProtobufCEnumDescriptor *d, int v)
{
	const char *s = cli_enum_name(d, v);
	char buf[64];
	if (!s && pb_enum_derive_name(d, v, '_', buf, sizeof(buf)) >= 0)
		s = buf;   /* an enum llamactl has no table for */
	if (s)
		json_str(j, s);
	else
		json_i64(j, v);
}

static void number(struct json *j, double v, unsigned flags)
{
	json_double(j, flags & PBJ_ROUND3 ? round(v * 1e3) / 1e3 : v);
}

/* One value of type f->type at p; returns its size (for arrays). */
static size_t value(struct json *j, const ProtobufCFieldDescriptor *f, const void *p,
		    unsigned flags)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		json_i64(j, *(const int32_t *)p);
		return sizeof(int32_t);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		json_u64(j, *(const uint32_t *)p);
		return sizeof(uint32_t);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		json_i64(j, *(const int64_t *)p);
		return sizeof(int64_t);
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		json_u64(j, *(const uint64_t *)p);
		return sizeof(uint64_t);
	case PROTOBUF_C_TYPE_FLOAT:
		number(j, *(const float *)p, flags);
		return sizeof(float);
	case PROTOBUF_C_TYPE_DOUBLE:
		number(j, *(const double *)p, flags);
		return sizeof(double);
	case PROTOBUF_C_TYPE_BOOL:
		json_bool(j, *(const protobuf_c_boolean *)p);
		return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_ENUM:
		enum_value(j, f->descriptor, *(const int *)p);
		return sizeof(int);
	case PROTOBUF_C_TYPE_STRING:
		json_str(j, *(char *const *)p);
		return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *b = p;
		json_strn(j, (const char *)b->data, b->len);
		return sizeof(*b);
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)p;
		if (sub)
			pbjson_object(j, sub);
		else
			json_null(j);
		return sizeof(sub);
	}
	}
	json_null(j);   /* a type this protobuf-c does not have */
	return 0;
}

/* Field f of m, under its key, unless its rule says otherwise. */
static void field(struct json *j, const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
		  unsigned flags)
{
	bool set = is_set(m, f);
	if ((flags & PBJ_SKIP) || (!set && (flags & PBJ_OMIT_UNSET)) ||
	    (!set && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)))
		return;
	json_key(j, f->name);
	const char *p = (const char *)m + f->offset;
	if (f->label == PROTOBUF_C_LABEL_REPEATED) {
		size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
		const char *v = *(const char *const *)p;
		json_arr_begin(j);
		for (size_t i = 0; i < n; i++)
			v += value(j, f, v, flags);
		json_arr_end(j);
	} else if (!set && (flags & PBJ_NULL_UNSET)) {
		json_null(j);
	} else if (!set && (flags & PBJ_EMPTY_UNSET)) {
		json_str(j, "");
	} else {
		value(j, f, p, flags);
	}
}

/* Field f, then the fields whose rules put them after it. */
static void field_and_followers(struct json *j, const ProtobufCMessage *m,
				const ProtobufCFieldDescriptor *f)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const struct rule *r = rule_of(d, f->name);
	field(j, m, f, r ? r->flags : 0);
	for (size_t i = 0; i < N_RULES; i++) {
		if (rules[i].msg != d || !rules[i].after || strcmp(rules[i].after, f->name) != 0)
			continue;
		const ProtobufCFieldDescriptor *g =
			protobuf_c_message_descriptor_get_field_by_name(d, rules[i].field);
		if (g)
			field_and_followers(j, m, g);
	}
}

void pbjson_members(struct json *j, const ProtobufCMessage *msg)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const struct rule *r = rule_of(d, d->fields[i].name);
		if (!r || !r->after)   /* a moved field comes with the one it follows */
			field_and_followers(j, msg, &d->fields[i]);
	}
}

void pbjson_object(struct json *j, const ProtobufCMessage *msg)
{
	json_obj_begin(j);
	pbjson_members(j, msg);
	json_obj_end(j);
}

void pbjson_line(const char *fmt, ...)
{
	struct json j;
	json_init(&j, stdout);
	/* per open container: 1 an object (then: a key is next), 0 an array */
	bool obj[JSON_MAX_DEPTH + 1] = { false }, key_next[JSON_MAX_DEPTH + 1] = { false };
	int depth = 0;
	va_list ap;
	va_start(ap, fmt);
	for (const char *f = fmt; *f; f++) {
		char c = *f;
		if (c == ' ' || c == ':' || c == ',')
			continue;
		bool in_obj = depth > 0 && obj[depth];
		if (in_obj && key_next[depth] && c != '}') {
			if (c == 's') {
				json_key(&j, va_arg(ap, const char *));
				key_next[depth] = false;
			} else if (c == 'M') {
				pbjson_members(&j, va_arg(ap, const ProtobufCMessage *));
			} else {
				abort();  /* a value where a key belongs */
			}
			continue;
		}
		switch (c) {
		case '{':
		case '[':
			if (depth == JSON_MAX_DEPTH)
				abort();
			if (c == '{')
				json_obj_begin(&j);
			else
				json_arr_begin(&j);
			depth++;
			obj[depth] = c == '{';
			key_next[depth] = c == '{';
			continue;
		case '}':
		case ']':
			if (depth == 0 || obj[depth] != (c == '}') || (c == '}' && !key_next[depth]))
				abort();
			if (c == '}')
				json_obj_end(&j);
			else
				json_arr_end(&j);
			depth--;
			break;
		case 's':
			if (f[1] == '#') {
				const char *s = va_arg(ap, const char *);
				json_strn(&j, s, va_arg(ap, size_t));
				f++;
			} else {
				json_str(&j, va_arg(ap, const char *));
			}
			break;
		case 'u': json_u64(&j, va_arg(ap, uint64_t)); break;
		case 'i': json_i64(&j, va_arg(ap, int64_t)); break;
		case 'b': json_bool(&j, va_arg(ap, int) != 0); break;
		case 'n': json_null(&j); break;
		default: abort();
		}
		if (depth > 0 && obj[depth])
			key_next[depth] = true;  /* a value was written: a key is next */
	}
	va_end(ap);
	if (depth != 0)
		abort();
	json_end(&j);
}
