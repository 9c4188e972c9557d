/*
 * client/enums.h — the names llamactl writes for the protocol's enum values,
 * in its text and in --json alike: derived from llamad.proto's descriptors
 * (proto/names.h), with the forms llamactl chose on purpose and its word for
 * a value it does not know.
 */
#ifndef LLAMACTL_ENUMS_H
#define LLAMACTL_ENUMS_H

#include <stdbool.h>

#include "proto/frame.h"

/* The name of `value` of enum d: "max_tokens", "llama2", "disk", ...; for a
 * value d does not have, llamactl's word for it ("unspecified", "default",
 * "pool", "?"). NULL for an enum llamactl has no names for. */
const char *cli_enum_name(const ProtobufCEnumDescriptor *d, int value);

/* The value of enum d named `name` (as cli_enum_name writes it): true and
 * *value, or false. */
bool cli_enum_value(const ProtobufCEnumDescriptor *d, const char *name, int *value);

static inline const char *cli_reason_name(int reason)
{
	return cli_enum_name(&llamad__stop_reason__descriptor, reason);
}

static inline const char *cli_template_name(int tmpl)
{
	return cli_enum_name(&llamad__template__descriptor, tmpl);
}

static inline const char *cli_policy_name(int policy)
{
	return cli_enum_name(&llamad__context_policy__descriptor, policy);
}

static inline const char *cli_role_name(int role)
{
	return cli_enum_name(&llamad__role__descriptor, role);
}

static inline const char *cli_location_name(int loc)
{
	return cli_enum_name(&llamad__location__descriptor, loc);
}

#endif
