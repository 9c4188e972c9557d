/*
 * tests/unit/test_names.c — enum value names from the protobuf-c
 * descriptors (proto/names.c), and the names llamactl and the error
 * replies use (client/enums.c's table is checked through the golden
 * --json outputs; frame_error_name here).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/frame.h"
#include "proto/names.h"

/* Every value of every enum of llamad.proto, derived with '_'. */
static void test_derived(void **state)
{
	(void)state;
	static const struct {
		const ProtobufCEnumDescriptor *d;
		int value;
		const char *name;
	} want[] = {
		{ &llamad__template__descriptor, LLAMAD__TEMPLATE__TEMPLATE_DEFAULT, "default" },
		{ &llamad__template__descriptor, LLAMAD__TEMPLATE__TEMPLATE_LLAMA2, "llama2" },
		{ &llamad__template__descriptor, LLAMAD__TEMPLATE__TEMPLATE_RAW, "raw" },
		{ &llamad__template__descriptor, LLAMAD__TEMPLATE__TEMPLATE_LLAMA3, "llama3" },
		{ &llamad__stop_reason__descriptor, LLAMAD__STOP_REASON__STOP_UNSPECIFIED, "unspecified" },
		{ &llamad__stop_reason__descriptor, LLAMAD__STOP_REASON__STOP_EOS, "eos" },
		{ &llamad__stop_reason__descriptor, LLAMAD__STOP_REASON__STOP_MAX_TOKENS, "max_tokens" },
		{ &llamad__stop_reason__descriptor, LLAMAD__STOP_REASON__STOP_STRING, "string" },
		{ &llamad__stop_reason__descriptor, LLAMAD__STOP_REASON__STOP_CONTEXT_FULL, "context_full" },
		{ &llamad__stop_reason__descriptor, LLAMAD__STOP_REASON__STOP_CANCELLED, "cancelled" },
		{ &llamad__location__descriptor, LLAMAD__LOCATION__LOCATION_POOL, "pool" },
		{ &llamad__location__descriptor, LLAMAD__LOCATION__LOCATION_RAM, "ram" },
		{ &llamad__location__descriptor, LLAMAD__LOCATION__LOCATION_DISK, "disk" },
		{ &llamad__context_policy__descriptor, LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT, "default" },
		{ &llamad__context_policy__descriptor, LLAMAD__CONTEXT_POLICY__CONTEXT_ERROR, "error" },
		{ &llamad__context_policy__descriptor, LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT, "shift" },
		{ &llamad__role__descriptor, LLAMAD__ROLE__ROLE_USER, "user" },
		{ &llamad__role__descriptor, LLAMAD__ROLE__ROLE_SYSTEM, "system" },
		{ &llamad__role__descriptor, LLAMAD__ROLE__ROLE_ASSISTANT, "assistant" },
		{ &llamad__role__descriptor, LLAMAD__ROLE__ROLE_RAW, "raw" },
		/* no common prefix: the whole name */
		{ &llamad__error_code__descriptor, LLAMAD__ERROR_CODE__ERROR_UNSPECIFIED, "error_unspecified" },
		{ &llamad__error_code__descriptor, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "resource_exhausted" },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char buf[32];
		int n = pb_enum_derive_name(want[i].d, want[i].value, '_', buf, sizeof(buf));
		assert_int_equal(n, (int)strlen(want[i].name));
		assert_string_equal(buf, want[i].name);
	}
}

static void test_derive_limits(void **state)
{
	(void)state;
	char buf[8];
	assert_int_equal(pb_enum_derive_name(&llamad__template__descriptor, 7, '_', buf, sizeof(buf)),
			 -ENOENT);
	assert_int_equal(pb_enum_derive_name(&llamad__stop_reason__descriptor,
					     LLAMAD__STOP_REASON__STOP_CONTEXT_FULL, ' ', buf, 8),
			 -ENOSPC);
	assert_string_equal(buf, "context");   /* what fits, terminated */
	assert_int_equal(pb_enum_derive_name(&llamad__stop_reason__descriptor,
					     LLAMAD__STOP_REASON__STOP_CONTEXT_FULL, ' ', buf, 0),
			 -ENOSPC);
}

static const struct pb_enum_alias tmpl_alias[] = {
	{ LLAMAD__TEMPLATE__TEMPLATE_DEFAULT, "auto" },   /* the daemon's word */
	{ 0, NULL },
};

/* A table: aliases first, derived names otherwise, unknown values NULL;
 * the reverse lookup sees the same names. */
static void test_table(void **state)
{
	(void)state;
	static struct pb_enum_names t =
		PB_ENUM_NAMES(&llamad__template__descriptor, '_', tmpl_alias);
	assert_string_equal(pb_enum_name(&t, LLAMAD__TEMPLATE__TEMPLATE_DEFAULT), "auto");
	assert_string_equal(pb_enum_name(&t, LLAMAD__TEMPLATE__TEMPLATE_LLAMA3), "llama3");
	const char *first = pb_enum_name(&t, LLAMAD__TEMPLATE__TEMPLATE_RAW);
	assert_ptr_equal(pb_enum_name(&t, LLAMAD__TEMPLATE__TEMPLATE_RAW), first);  /* built once */
	assert_null(pb_enum_name(&t, 4));
	assert_null(pb_enum_name(&t, -1));
	int v = -1;
	assert_true(pb_enum_value(&t, "auto", &v));
	assert_int_equal(v, LLAMAD__TEMPLATE__TEMPLATE_DEFAULT);
	assert_true(pb_enum_value(&t, "llama2", &v));
	assert_int_equal(v, LLAMAD__TEMPLATE__TEMPLATE_LLAMA2);
	assert_false(pb_enum_value(&t, "default", &v));   /* hidden by the alias */
	assert_false(pb_enum_value(&t, "LLAMA2", &v));
	assert_false(pb_enum_value(&t, "", &v));
}

/* The error names the replies and llamactl print: spaces, four aliases,
 * "error" for codes unknown to this build. */
static void test_error_names(void **state)
{
	(void)state;
	static const struct {
		int code;
		const char *name;
	} want[] = {
		{ 0, "error" },
		{ LLAMAD__ERROR_CODE__BAD_REQUEST, "bad request" },
		{ LLAMAD__ERROR_CODE__UNKNOWN_SESSION, "unknown session" },
		{ LLAMAD__ERROR_CODE__SESSION_EXISTS, "session exists" },
		{ LLAMAD__ERROR_CODE__CONTEXT_FULL, "context full" },
		{ LLAMAD__ERROR_CODE__BUSY, "busy" },
		{ LLAMAD__ERROR_CODE__BAD_VERSION, "bad version" },
		{ LLAMAD__ERROR_CODE__TOO_LARGE, "too large" },
		{ LLAMAD__ERROR_CODE__CANCELLED, "cancelled" },
		{ LLAMAD__ERROR_CODE__UNKNOWN_OP, "unknown operation" },
		{ LLAMAD__ERROR_CODE__REFUSED_TEXT, "refused text" },
		{ LLAMAD__ERROR_CODE__UNKNOWN_REQUEST, "unknown request" },
		{ LLAMAD__ERROR_CODE__PERMISSION_DENIED, "permission denied" },
		{ LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "resource exhausted" },
		{ LLAMAD__ERROR_CODE__INTERNAL, "internal error" },
		{ LLAMAD__ERROR_CODE__SHUTTING_DOWN, "shutting down" },
		{ LLAMAD__ERROR_CODE__STORAGE, "storage error" },
		{ 13, "error" },
		{ 42, "error" },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		assert_string_equal(frame_error_name(want[i].code), want[i].name);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_derived),
		cmocka_unit_test(test_derive_limits),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_error_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
