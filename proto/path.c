/*
 * proto/path.c — see path.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/path.h"

char *path_default_socket(void)
{
	const char *env = getenv("LLAMAD_SOCKET");
	if (env && *env)
		return strdup(env);
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (geteuid() != 0 && xdg && *xdg) {
		char *p;
		if (asprintf(&p, "%s/llamad/llamad.sock", xdg) < 0)
			return NULL;
		return p;
	}
	return strdup(LLAMAD_SOCKET_SYSTEM);
}
