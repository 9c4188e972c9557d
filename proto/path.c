/*
 * proto/path.c — see path.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/path.h"

int path_client_sockets(char *out[PATH_CANDIDATES])
{
	const char *env = getenv("LLAMAD_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n = 0;
	if (env && *env) {
		out[n++] = strdup(env);
	} else {
		if (geteuid() != 0 && xdg && *xdg &&
		    asprintf(&out[n++], "%s/llamad/llamad.sock", xdg) < 0)
			out[n - 1] = NULL;
		out[n++] = strdup(LLAMAD_SOCKET_SYSTEM);
	}
	for (int i = 0; i < n; i++) {
		if (!out[i]) {
			for (int j = 0; j < n; j++)
				free(out[j]);
			return -ENOMEM;
		}
	}
	return n;
}

char *path_default_socket(void)
{
	char *p[PATH_CANDIDATES];
	int n = path_client_sockets(p);
	if (n < 0)
		return NULL;
	for (int i = 1; i < n; i++)
		free(p[i]);
	return p[0];
}
