/* daemon/version.h — the release number, shown by --version and Hello. */
#ifndef LLAMAD_DAEMON_VERSION_H
#define LLAMAD_DAEMON_VERSION_H
#define LLAMAD_VERSION "0.2.0"
#endif
