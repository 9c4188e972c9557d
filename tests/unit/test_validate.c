/*
 * tests/unit/test_validate.c — daemon/validate.c's checks that come from
 * the descriptors: every enum field of every request, found by walking
 * llamad.proto's descriptors (so a field added later is covered), sent
 * through the wire (packed, scanned, unpacked) with each of its enum's
 * values (accepted) and with -1, -2, INT32_MIN, INT32_MAX and the first
 * value past the enum's (each refused, naming the field).
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/validate.h"
#include "proto/frame.h"

/* A message of descriptor d with what validation needs to accept it:
 * every string field a short valid text (session ids, texts), nested
 * messages made the same way. Freed with free_msg. */
static ProtobufCMessage *make_msg(const ProtobufCMessageDescriptor *d, int depth)
{
	ProtobufCMessage *m = calloc(1, d->sizeof_message);
	assert_non_null(m);
	protobuf_c_message_init(d, m);
	char *base = (char *)m;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->label == PROTOBUF_C_LABEL_REPEATED || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		if (f->type == PROTOBUF_C_TYPE_STRING) {
			/* ListSessions.after must be a cursor; none is fine */
			if (strcmp(f->name, "after"))
				*(char **)(base + f->offset) = strdup("s");
		} else if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 2) {
			*(ProtobufCMessage **)(base + f->offset) = make_msg(f->descriptor, depth + 1);
		}
	}
	return m;
}

static void free_msg(ProtobufCMessage *m)
{
	protobuf_c_message_free_unpacked(m, NULL);  /* every member was malloc'd */
}

/* Pack q, scan and unpack it as server.c does, validate: the result. */
static int through_wire(const Llamad__Request *q, const char **why)
{
	size_t n = llamad__request__get_packed_size(q);
	uint8_t *buf = malloc(n ? n : 1);
	assert_non_null(buf);
	llamad__request__pack(q, buf);
	uint64_t id;
	int rc = request_scan(buf, n, 1 << 20, &id, why);
	assert_int_equal(id, q->id);
	if (rc == 0) {
		Llamad__Request *u = llamad__request__unpack(NULL, n, buf);
		assert_non_null(u);
		rc = request_validate(u, 1 << 20, why);
		llamad__request__free_unpacked(u, NULL);
	}
	free(buf);
	return rc;
}

/* Set enum field f of m to v (present). */
static void set_enum(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, int v)
{
	char *base = (char *)m;
	*(int *)(base + f->offset) = v;
	if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
		*(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
}

/* Every enum field of the request op's message `sub` (one level of nested
 * messages too), each value tried; *n_fields counts the fields tried. */
static void try_enums(Llamad__Request *q, ProtobufCMessage *sub, const char *op, int *n_fields)
{
	const ProtobufCMessageDescriptor *d = sub->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED) {
			ProtobufCMessage *inner = *(ProtobufCMessage **)((char *)sub + f->offset);
			if (inner)
				try_enums(q, inner, op, n_fields);
			continue;
		}
		if (f->type != PROTOBUF_C_TYPE_ENUM || f->label == PROTOBUF_C_LABEL_REPEATED)
			continue;
		const ProtobufCEnumDescriptor *e = f->descriptor;
		(*n_fields)++;
		const char *why = NULL;
		int max = INT_MIN;
		for (unsigned k = 0; k < e->n_values; k++) {
			int v = e->values[k].value;
			max = v > max ? v : max;
			set_enum(sub, f, v);
			int rc = through_wire(q, &why);
			if (rc != 0)
				fail_msg("%s %s.%s = %s (%d): refused: %s", op, d->short_name, f->name,
					 e->values[k].name, v, why);
		}
		const int bad[] = { -1, -2, INT_MIN, INT_MAX, max + 1 };
		for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
			set_enum(sub, f, bad[k]);
			why = NULL;
			int rc = through_wire(q, &why);
			if (rc != -EINVAL || !why || !strstr(why, f->name))
				fail_msg("%s %s.%s = %d: rc %d (%s), wanted -EINVAL naming the field", op,
					 d->short_name, f->name, bad[k], rc, why ? why : "no reason");
		}
		set_enum(sub, f, e->values[0].value);
	}
}

static void test_every_enum_field(void **state)
{
	(void)state;
	const ProtobufCMessageDescriptor *rd = &llamad__request__descriptor;
	int n_ops = 0, n_fields = 0;
	for (unsigned i = 0; i < rd->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &rd->fields[i];
		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		PB_SET(&q, id, 7);
		ProtobufCMessage *sub = make_msg(f->descriptor, 1);
		q.op_case = (Llamad__Request__OpCase)f->id;
		*(ProtobufCMessage **)((char *)&q + f->offset) = sub;
		/* as made, the request passes: a refusal below is the enum's */
		const char *why = NULL;
		int rc = through_wire(&q, &why);
		if (rc != 0)
			fail_msg("the plain %s request is refused: %s", f->name, why);
		try_enums(&q, sub, f->name, &n_fields);
		free_msg(sub);
		n_ops++;
	}
	/* OpenSession (template, context_policy), Append and Generate (role):
	 * at least these; more as llamad.proto grows */
	assert_true(n_ops >= 15);
	assert_true(n_fields >= 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_enum_field),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
