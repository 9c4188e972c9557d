/*
 * client/enums.c — see enums.h.
 */

#include "client/enums.h"
#include "proto/names.h"

/* STOP_STRING: the reason is that a stop string matched */
static const struct pb_enum_alias reason_alias[] = {
	{ LLAMAD__STOP_REASON__STOP_STRING, "stop" },
	{ 0, NULL },
};

/* Each enum of llamad.proto that llamactl prints, and its word for a value
 * it does not know. */
static struct client_enum {
	struct pb_enum_names names;
	const char *unknown;
} enums[] = {
	{ PB_ENUM_NAMES(&llamad__stop_reason__descriptor, '_', reason_alias), "unspecified" },
	{ PB_ENUM_NAMES(&llamad__template__descriptor, '_', NULL), "default" },
	{ PB_ENUM_NAMES(&llamad__context_policy__descriptor, '_', NULL), "default" },
	{ PB_ENUM_NAMES(&llamad__role__descriptor, '_', NULL), "?" },
	{ PB_ENUM_NAMES(&llamad__location__descriptor, '_', NULL), "pool" },
};

static struct client_enum *find(const ProtobufCEnumDescriptor *d)
{
	for (size_t i = 0; i < sizeof(enums) / sizeof(enums[0]); i++)
		if (enums[i].names.desc == d)
			return &enums[i];
	return NULL;
}

const char *cli_enum_name(const ProtobufCEnumDescriptor *d, int value)
{
	struct client_enum *e = find(d);
	if (!e)
		return NULL;
	const char *s = pb_enum_name(&e->names, value);
	return s ? s : e->unknown;
}

bool cli_enum_value(const ProtobufCEnumDescriptor *d, const char *name, int *value)
{
	struct client_enum *e = find(d);
	return e && pb_enum_value(&e->names, name, value);
}
