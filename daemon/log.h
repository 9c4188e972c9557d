/*
 * daemon/log.h — the daemon's log: one line per event on stderr, with a
 * syslog priority prefix ("<3>") when stderr is the journal, so journald
 * keeps the level. Only daemon/ logs (library code returns errors).
 */
#ifndef LLAMAD_DAEMON_LOG_H
#define LLAMAD_DAEMON_LOG_H

enum log_level { LL_ERROR = 0, LL_WARN = 1, LL_INFO = 2, LL_DEBUG = 3 };

/* Messages above `level` are dropped. */
void log_set_level(int level);
/* Use "<N>" priority prefixes instead of timestamps (journald). */
void log_set_journal(int on);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
