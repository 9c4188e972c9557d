;;; fallback.el --- the socket llamad.el reaches by default  -*- lexical-binding: t -*-

;; Run by tests/integration/emacs.sh (through tests/tools/fallback.sh) as
;; another uid, with no socket configured (`llamad-socket' nil, no
;; $LLAMAD_SOCKET): lists the sessions (`llamad-list', as
;; `llamad-list-sessions' does) and prints one line: "result: connected
;; PATH MODEL" (the socket reached, the model its daemon's HelloReply names)
;; or "result: error MESSAGE" (the error the user was given).

;;; Code:

(require 'llamad)

(setq llamad-socket nil)
(let (listed)
  (condition-case err
      (progn
        (llamad-list (lambda (_sessions) (setq listed t)))
        (let ((end (+ (float-time) 15)))
          (while (and (not listed) (< (float-time) end))
            (accept-process-output nil 0.05)))
        (princ (if listed
                   (format "result: connected %s %s\n" (llamad--conn-socket llamad--conn)
                           (llamad--hello llamad--conn :model))
                 "result: no answer within 15 s\n")))
    (user-error (princ (format "result: error %s\n" (cadr err))))))

;;; fallback.el ends here
