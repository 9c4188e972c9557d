;;; llamad.el --- Chat with the llamad model daemon from Emacs  -*- lexical-binding: t -*-

;; Author: The llamad authors
;; Version: 0.2.0
;; Package-Requires: ((emacs "27.1"))
;; Keywords: comm, tools, convenience

;; This file is not part of GNU Emacs.

;;; Commentary:

;; llamad(8) serves Llama language models to the programs of one machine
;; over a Unix socket.  This package talks to it directly (no llamactl, no
;; subprocess): it sends the region, or the whole buffer, as a user turn
;; into a session of the daemon and streams the answer, as it is generated,
;; into an answer buffer `*llamad: SESSION*' (or, with a prefix argument,
;; at point).  Sessions live in the daemon: they keep the conversation and
;; its cache between turns, between Emacs sessions and across editors.
;;
;; To enable it, put llamad.el and llamad-proto.el in a folder of your
;; `load-path' (make install puts them in PREFIX/share/emacs/site-lisp,
;; which is on it for PREFIX /usr/local) and add to your init file:
;;
;;   (add-to-list 'load-path "/usr/local/share/emacs/site-lisp")
;;   (require 'llamad)
;;   (llamad-mode 1)
;;
;; `llamad-mode' puts the commands under the prefix C-c = (see
;; `llamad-mode-map'); or bind `llamad-command-map' to a prefix of your own,
;; e.g. (global-set-key (kbd "C-c l") 'llamad-command-map).  The keys:
;;
;;   s  llamad-send             region (or whole buffer) as a user turn;
;;                              with C-u, the answer goes at point
;;   k  llamad-cancel           stop the running answer (C-c C-k in the
;;                              answer buffer); the part so far is kept
;;   f  llamad-fork             fork the session and continue in the fork
;;   t  llamad-transcript       the session's last turns (C-u N: last N)
;;   l  llamad-list-sessions    the daemon's sessions (RET switches)
;;   w  llamad-switch-session   use another session for this project
;;
;; The session: `llamad-session' if set, else one per project, named
;; BASENAME-HASH after the project's folder (the nearest one above holding
;; .git, else `default-directory'): the folder's name reduced to the
;; characters A-Z a-z 0-9 . _ - (others dropped) and cut to 40 ("project"
;; if none is left), and the
;; first 8 hex digits of the SHA-256 of its absolute path, without a
;; trailing slash.  The Neovim plugin names sessions the same way, so both
;; editors share a project's conversation.
;;
;; The socket: `llamad-socket' if set, else as llamactl finds it:
;; $LLAMAD_SOCKET, else your own $XDG_RUNTIME_DIR/llamad/llamad.sock (not
;; root) and then the system service's /run/llamad/llamad.sock, the second
;; tried when nothing listens at the first.  See `M-x customize-group RET
;; llamad'.

;;; Code:

(require 'cl-lib)
(require 'llamad-proto)

;;;; Settings

(defgroup llamad nil
  "Chat with the llamad model daemon."
  :group 'tools
  :prefix "llamad-")

(defcustom llamad-socket nil
  "The daemon's socket, or nil for the default sockets.
A socket set here is the only one tried.  The default, as for llamactl,
is $LLAMAD_SOCKET alone if set and not empty; else, in turn, your own
daemon's $XDG_RUNTIME_DIR/llamad/llamad.sock (when not root and
XDG_RUNTIME_DIR is set) and the system service's
/run/llamad/llamad.sock.  The next one is tried only when nothing
listens at one (no such file, connection refused); any other error
\(permission denied: not in the llamad group, ...) stops there.  When
none can be reached, the error names every socket tried with its error.
See `llamad-socket-paths'."
  :type '(choice (const :tag "Default" nil) (file :tag "Socket path")))

(defcustom llamad-session nil
  "The session turns are sent to, or nil for one per project.
See `llamad-project-session-name'.  `llamad-switch-session' and
`llamad-fork' override it for the current project."
  :type '(choice (const :tag "One per project" nil) (string :tag "Session id")))

(defcustom llamad-max-tokens nil
  "Most tokens of an answer, or nil for the daemon's default."
  :type '(choice (const :tag "Daemon's default" nil) natnum))

(defcustom llamad-temperature nil
  "Sampling temperature (0: greedy), or nil for the daemon's default."
  :type '(choice (const :tag "Daemon's default" nil) number))

(defcustom llamad-stop nil
  "Stop strings: an answer ends before the first of them (at most 16)."
  :type '(repeat string))

(defcustom llamad-transcript-turns 20
  "Turns `llamad-transcript' shows without a prefix argument (0: all)."
  :type 'natnum)

(defcustom llamad-max-reply-bytes (* 64 1024 1024)
  "Largest reply frame accepted from the daemon, in bytes.
A reply announcing more is an error and closes the connection."
  :type 'natnum)

;;;; The connection

(cl-defstruct (llamad-generation (:constructor llamad--generation-make) (:copier nil))
  "An answer being generated (or generated) into a buffer."
  session prompt conn id
  options       ; the Generate fields besides session and prompt
  marker        ; where the text goes (moves with it)
  parts         ; the text received, newest first
  (events 0)    ; token events received
  (state 'starting)  ; starting, running, done, error, closed, refused
  done          ; the Done plist
  error         ; the message of an error
  cancel)       ; non-nil: cancel asked before the Generate was sent

(defvar llamad--generations nil
  "The generations running, newest first.")

(cl-defstruct (llamad--conn (:constructor llamad--conn-make) (:copier nil))
  "A connection to the daemon and what it waits for."
  process
  socket        ; the socket connected to
  paths         ; the sockets it was to try (`llamad-socket-paths')
  (next-id 1)
  (handlers (make-hash-table :test 'eql))  ; id -> (CALLBACK . STREAM)
  hello         ; the HelloReply plist, once it came
  waiting       ; functions to call when it comes (or the connection fails)
  (pend "")     ; received bytes not yet framed, from POS on
  (pos 0)
  chunks        ; chunks received after PEND, newest first
  (more 0)      ; their total length
  closed)       ; non-nil once closed: the reason

(defvar llamad--conn nil
  "The connection to the daemon, or nil.")

(defvar llamad-record-latency nil
  "When non-nil, token events push their timing on `llamad-latency-samples'.")

(defvar llamad-latency-samples nil
  "Timings of token events while `llamad-record-latency' is set, newest first.
Each is (SINCE-CHUNK . OWN) in seconds: from the process filter receiving
the chunk holding the event to its text being in the buffer, and the time
spent on this event alone (decoding, inserting, hooks).")

(defvar llamad--event-start nil
  "When the frame being dispatched started being processed (latency records).")

(defvar llamad--chunk-time nil
  "When the process filter received the chunk being processed.")

(defun llamad-socket-paths ()
  "Return the list of sockets to try, in order (see `llamad-socket')."
  (let ((env (getenv "LLAMAD_SOCKET"))
        (xdg (getenv "XDG_RUNTIME_DIR")))
    (cond (llamad-socket (list (expand-file-name llamad-socket)))
          ((and env (not (string= env ""))) (list env))
          (t (append (and xdg (not (string= xdg "")) (/= (user-uid) 0)
                          (list (expand-file-name "llamad/llamad.sock" xdg)))
                     (list "/run/llamad/llamad.sock"))))))

(defun llamad-socket-path ()
  "Return the first socket `llamad-socket-paths' tries."
  (car (llamad-socket-paths)))

(defun llamad--connection ()
  "Return a live connection to the daemon, connecting if there is none.
A connection that was closed, or to other sockets, is replaced.  Signal
a `user-error' naming the sockets tried when the daemon cannot be
reached."
  (let ((paths (llamad-socket-paths))
        (conn llamad--conn))
    (if (and conn (not (llamad--conn-closed conn))
             (equal paths (llamad--conn-paths conn))
             (process-live-p (llamad--conn-process conn)))
        conn
      (when conn
        (llamad--drop conn "replaced" t))
      (setq llamad--conn (llamad--open paths)))))

(defun llamad--dial (paths)
  "Connect to the first of PATHS where a daemon listens.
Return (PATH . PROCESS).  The next path is tried only when nothing
listens at one (no such file, connection refused); when none can be
reached, signal a `user-error' naming each path tried with its error."
  (let (tried found)
    (while (and paths (not found))
      (let ((path (pop paths)))
        (condition-case err
            ;; system error texts in English: "Connection refused" is
            ;; recognized, and the error says the same in every locale
            (let ((process-adaptive-read-buffering nil)  ; no read delays
                  (system-messages-locale "C"))
              (setq found
                    (cons path
                          (make-network-process
                           :name "llamad" :family 'local :service path :nowait nil
                           :coding 'binary :noquery t :buffer nil
                           :filter #'llamad--filter :sentinel #'llamad--sentinel))))
          (file-error
           (let ((why (or (nth 2 err) (error-message-string err))))
             (push (format "%s (%s)" path why) tried)
             ;; anything but ENOENT and ECONNREFUSED: say it, try no other
             (unless (or (eq (car err) 'file-missing) (equal why "Connection refused"))
               (setq paths nil)))))))
    (or found
        (user-error "llamad: cannot connect to %s; is llamad running?"
                    (mapconcat #'identity (nreverse tried) " or ")))))

(defun llamad--open (paths)
  "Connect to the first daemon of PATHS and send Hello; return the connection.
See `llamad--dial'."
  (let* ((dialed (llamad--dial paths))
         (conn (llamad--conn-make :socket (car dialed) :paths paths))
         (process (cdr dialed)))
    (process-put process 'llamad-conn conn)
    (setf (llamad--conn-process conn) process)
    (llamad--request
     conn :hello (list :protocol-version 1 :client "llamad.el 0.2.0")
     (lambda (kind body)
       (if (eq kind :hello)
           (let ((waiting (llamad--conn-waiting conn)))
             (setf (llamad--conn-hello conn) body
                   (llamad--conn-waiting conn) nil)
             (dolist (fn waiting)
               (llamad--safely fn nil)))
         (llamad--drop conn (if (eq kind :error)
                                (llamad--error-text body)
                              (format "llamad: unexpected reply to Hello (%s)" kind))))))
    conn))

(defun llamad--when-ready (conn fn)
  "Call FN with nil once CONN's Hello is answered: now if it is.
If CONN closes first, call FN with the reason (FN then says nothing:
the reason is shown once, by `llamad--drop')."
  (if (llamad--conn-hello conn)
      (funcall fn nil)
    (setf (llamad--conn-waiting conn)
          (append (llamad--conn-waiting conn) (list fn)))))

(defun llamad--hello (conn key)
  "Return KEY of CONN's HelloReply (e.g. :max-text), or nil."
  (plist-get (llamad--conn-hello conn) key))

(defun llamad--request (conn op value callback &optional stream)
  "Send a Request with operation OP (a keyword) and VALUE on CONN.
CALLBACK is called with each reply's body kind and value: (:session
PLIST), (:error PLIST), ...; or (:closed REASON) if CONN closes first.
With STREAM (a Generate), the replies up to a :done or :error go to
CALLBACK; otherwise just one.  Return the request's id."
  (let* ((id (llamad--conn-next-id conn))
         (frame (llamad-proto-frame 'Request (list :id id op value)))
         (max-frame (llamad--hello conn :max-frame)))
    (when (and max-frame (> (- (length frame) 4) max-frame))
      (user-error "llamad: the request is %d bytes, more than llamad accepts \
\(max_frame = %d bytes); nothing was sent" (- (length frame) 4) max-frame))
    (setf (llamad--conn-next-id conn) (1+ id))
    (puthash id (cons callback stream) (llamad--conn-handlers conn))
    (condition-case err
        (process-send-string (llamad--conn-process conn) frame)
      (error
       (remhash id (llamad--conn-handlers conn))
       (llamad--drop conn (format "llamad: the connection is lost (%s)"
                                  (error-message-string err))
                     t)
       (user-error "llamad: the connection to %s was lost; try again"
                   (llamad--conn-socket conn))))
    id))

(defun llamad--error-text (err)
  "Return the line shown for the Error plist ERR: llamad: CODE: message."
  (format "llamad: %s: %s"
          (llamad-proto-enum-name 'ErrorCode (or (plist-get err :code) 0))
          (or (plist-get err :message) "")))

(defun llamad--safely (fn &rest args)
  "Call FN with ARGS; show an error it signals as a message instead.
Used where no command is running (process filter, sentinel)."
  (condition-case err
      (apply fn args)
    (error (message "%s" (error-message-string err)) nil)))

(defun llamad--filter (process chunk)
  "Take CHUNK of the daemon's output on PROCESS; dispatch complete frames."
  (let ((conn (process-get process 'llamad-conn))
        (llamad--chunk-time (and llamad-record-latency (float-time))))
    (when (and conn (not (llamad--conn-closed conn)))
      (llamad--receive conn chunk))))

(defun llamad--merge (conn)
  "Join CONN's unframed bytes into one string from position 0."
  (let ((pend (llamad--conn-pend conn))
        (pos (llamad--conn-pos conn))
        (chunks (nreverse (llamad--conn-chunks conn))))
    (setf (llamad--conn-pend conn)
          (if (and (= pos (length pend)) (null (cdr chunks)))
              (car chunks)
            (apply #'concat (substring pend pos) chunks))
          (llamad--conn-pos conn) 0
          (llamad--conn-chunks conn) nil
          (llamad--conn-more conn) 0)))

(defun llamad--receive (conn chunk)
  "Add CHUNK to CONN's input and dispatch every frame it completes.
Chunks may split frames anywhere.  A frame announcing more than
`llamad-max-reply-bytes', or one that does not decode, closes CONN."
  (push chunk (llamad--conn-chunks conn))
  (cl-incf (llamad--conn-more conn) (length chunk))
  (catch 'wait
    (while (not (llamad--conn-closed conn))
      (let* ((have (- (length (llamad--conn-pend conn)) (llamad--conn-pos conn)))
             (avail (+ have (llamad--conn-more conn))))
        (when (< avail 4)
          (throw 'wait nil))
        (when (< have 4)
          (llamad--merge conn)
          (setq have avail))
        (let* ((pend (llamad--conn-pend conn))
               (pos (llamad--conn-pos conn))
               (n (llamad-proto-frame-length pend pos)))
          (when (> n llamad-max-reply-bytes)
            (llamad--drop conn (format "llamad: the daemon sent a reply frame of %d \
bytes, over the limit of %d bytes (llamad-max-reply-bytes); connection closed"
                                       n llamad-max-reply-bytes))
            (throw 'wait nil))
          (when (< avail (+ 4 n))
            (throw 'wait nil))
          (when (< have (+ 4 n))
            (llamad--merge conn)
            (setq pend (llamad--conn-pend conn) pos 0))
          (setf (llamad--conn-pos conn) (+ pos 4 n))
          (llamad--dispatch conn pend (+ pos 4) (+ pos 4 n)))))))

(defun llamad--dispatch (conn s start end)
  "Decode the Response in bytes START to END of S; hand it to its callback.
The callback is the one CONN's request of that id registered."
  (let ((t0 (and llamad-record-latency (float-time)))
        (resp (condition-case err
                  (llamad-proto-decode 'Response s start end)
                (llamad-proto-error
                 (llamad--drop conn (format "llamad: malformed reply from the \
daemon (%s); connection closed" (cadr err)))
                 nil))))
    (when resp
      (let* ((id (or (plist-get resp :id) 0))
             (body (let ((p resp))
                     (while (and p (eq (car p) :id))
                       (setq p (cddr p)))
                     p))
             (kind (car body))
             (entry (gethash id (llamad--conn-handlers conn))))
        (cond
         (entry
          (when (or (not (cdr entry)) (memq kind '(:done :error)))
            (remhash id (llamad--conn-handlers conn)))
          (let ((llamad--event-start t0))
            (llamad--safely (car entry) kind (cadr body))))
         ((eq kind :error)  ; id 0: a frame the daemon could not attribute
          (message "%s" (llamad--error-text (cadr body)))))))))

(defun llamad--sentinel (process _event)
  "Notice that PROCESS, a connection to the daemon, closed."
  (let ((conn (process-get process 'llamad-conn)))
    (when (and conn (not (llamad--conn-closed conn))
               (not (process-live-p process)))
      (llamad--drop conn
                    (cond ((cl-some (lambda (g) (eq (llamad-generation-conn g) conn))
                                    llamad--generations)
                           "llamad closed the connection during the answer")
                          ((llamad--conn-hello conn) "llamad closed the connection")
                          (t "llamad closed the connection before answering Hello"))
                    'idle))))

(defun llamad--drop (conn reason &optional quiet)
  "Close CONN for REASON: fail what waits on it, and say so once.
Pending requests get (:closed REASON); the message is REASON, plus what
happened to a running answer.  QUIET t says nothing; `idle' says nothing
unless something was waiting."
  (unless (llamad--conn-closed conn)
    (setf (llamad--conn-closed conn) reason)
    (let* ((handlers (llamad--conn-handlers conn))
           (waiting (llamad--conn-waiting conn))
           (answers (cl-remove-if-not (lambda (g) (eq (llamad-generation-conn g) conn))
                                      llamad--generations))
           (kept (cl-some (lambda (g) (llamad-generation-parts g)) answers))
           entries)
      (maphash (lambda (_id entry) (push (car entry) entries)) handlers)
      (clrhash handlers)
      (setf (llamad--conn-waiting conn) nil)
      (when (eq llamad--conn conn)
        (setq llamad--conn nil))
      (when (process-live-p (llamad--conn-process conn))
        (delete-process (llamad--conn-process conn)))
      (dolist (fn entries)
        (llamad--safely fn :closed reason))
      (dolist (fn waiting)
        (llamad--safely fn reason))
      (unless (or (eq quiet t)
                  (and (eq quiet 'idle) (null entries) (null waiting)))
        (message "%s%s" reason
                 (cond (kept "; the partial text is kept")
                       (answers "; the answer had not started")
                       (t "")))))))

;;;; Sessions

(defvar llamad--known-sessions nil
  "Session ids of the last listing, for completion.")

(defvar llamad--project-sessions (make-hash-table :test 'equal)
  "Session chosen per project folder by `llamad-switch-session' or `llamad-fork'.")

(defun llamad-project-directory (&optional dir)
  "Return the project folder of DIR (default `default-directory').
It is the nearest folder at or above DIR that holds .git, else DIR, as
an absolute path without a trailing slash."
  (let* ((dir (expand-file-name (or dir default-directory)))
         (root (locate-dominating-file dir ".git")))
    (directory-file-name (expand-file-name (or root dir)))))

(defun llamad-project-session-name (&optional dir)
  "Return the default session name of the project of DIR.
BASENAME-HASH: the project folder's name (`llamad-project-directory')
with the characters other than A-Z a-z 0-9 . _ - dropped, at most 40 of
them (\"project\" if none is left), a dash, and the first 8 hex digits of
the SHA-256 of the folder's absolute path (UTF-8, no trailing slash)."
  (let* ((proj (llamad-project-directory dir))
         (case-fold-search nil)
         (base (replace-regexp-in-string "[^A-Za-z0-9._-]" ""
                                         (file-name-nondirectory proj) t t)))
    (format "%s-%s" (if (string= base "") "project" (substring base 0 (min 40 (length base))))
            (substring (secure-hash 'sha256 (encode-coding-string proj 'utf-8-unix))
                       0 8))))

(defun llamad-current-session ()
  "Return the session of the current buffer's project.
The one chosen with `llamad-switch-session' or `llamad-fork' for the
project, else `llamad-session', else `llamad-project-session-name'."
  (or (gethash (llamad-project-directory) llamad--project-sessions)
      llamad-session
      (llamad-project-session-name)))

(defun llamad--check-session-id (name)
  "Signal a `user-error' unless NAME is a valid session id."
  (unless (and (stringp name)
               (let ((case-fold-search nil))
                 (string-match-p "\\`[A-Za-z0-9._:-]\\{1,128\\}\\'" name)))
    (user-error "llamad: %S is not a session id (1 to 128 of A-Z a-z 0-9 . _ : -)"
                name)))

(defun llamad--call (op value kind callback)
  "Send the request OP with VALUE; call CALLBACK with its reply's value.
KIND is the body expected (e.g. :session).  CALLBACK gets (RESULT nil),
or (nil MESSAGE) on an Error reply or another body; when the connection
closes it is not called (`llamad--drop' says why)."
  (let ((conn (llamad--connection)))
    (llamad--when-ready
     conn
     (lambda (err)
       (unless err
         (llamad--request
          conn op value
          (lambda (k body)
            (cond ((eq k kind) (funcall callback body nil))
                  ((eq k :error) (funcall callback nil (llamad--error-text body)))
                  ((eq k :closed))
                  (t (funcall callback nil (format "llamad: unexpected reply %s" k)))))))))))

;;;; Generations

(defun llamad-generation-text (gen)
  "Return the text of GEN's answer received so far."
  (apply #'concat (reverse (llamad-generation-parts gen))))

(defvar llamad-token-functions nil
  "Abnormal hook run on each token event with the generation and its text.")

(defvar llamad-answer-end-functions nil
  "Abnormal hook run with the generation when an answer ends, however.")

(defvar-local llamad--generation nil
  "In an answer buffer, the generation that writes there last.")

(defvar llamad-answer-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "C-c C-k") #'llamad-cancel)
    (define-key map (kbd "C-c C-t") #'llamad-transcript)
    map)
  "Keys of `llamad-answer-mode'.")

(define-derived-mode llamad-answer-mode text-mode "llamad"
  "Major mode of the buffers answers stream into.
\\{llamad-answer-mode-map}")

(defun llamad--answer-marker (session prompt)
  "Start an exchange in SESSION's answer buffer; return where the answer goes.
The buffer, *llamad: SESSION*, shows the start of PROMPT above it."
  (let ((dir default-directory)
        (buf (get-buffer-create (format "*llamad: %s*" session))))
    (with-current-buffer buf
      (unless (derived-mode-p 'llamad-answer-mode)
        (llamad-answer-mode))
      (setq default-directory dir)
      (let ((inhibit-read-only t)
            (first (car (split-string prompt "\n"))))
        (goto-char (point-max))
        (unless (bobp)
          (insert "\n\n"))
        (insert (propertize
                 (format "── you: %s%s\n"
                         (truncate-string-to-width first 60 nil nil "…")
                         (if (> (length prompt) (length first))
                             (format " (%d chars)" (length prompt)) ""))
                 'face 'shadow))
        (let ((m (copy-marker (point) t)))
          (dolist (w (get-buffer-window-list buf nil t))
            (set-window-point w m))
          m)))))

(defun llamad-generate (prompt &optional session marker)
  "Send PROMPT as a user turn into SESSION and stream the answer.
SESSION defaults to `llamad-current-session'.  The text goes at MARKER
\(it should advance on insertion), or into the session's answer buffer.
Refuse a PROMPT over the daemon's max_text before sending anything.
The options (`llamad-max-tokens', `llamad-temperature', `llamad-stop')
are those in effect now.  Return the `llamad-generation', which fills in
as replies come; `llamad-token-functions' and
`llamad-answer-end-functions' follow it."
  (let* ((session (or session (llamad-current-session)))
         (bytes (encode-coding-string prompt 'utf-8-unix))
         (conn (progn (llamad--check-session-id session) (llamad--connection)))
         (gen (llamad--generation-make
               :session session :prompt prompt :conn conn
               :options `(:max-tokens ,llamad-max-tokens :stop ,llamad-stop
                          ,@(and llamad-temperature
                                 (list :sampler (list :temperature llamad-temperature)))))))
    (llamad--when-ready
     conn
     (lambda (err)
       (if err
           (setf (llamad-generation-state gen) 'closed
                 (llamad-generation-error gen) err)
         (let ((max-text (llamad--hello conn :max-text)))
           (when (and max-text (> (length bytes) max-text))
             (setf (llamad-generation-state gen) 'refused)
             (user-error "llamad: the text is %d bytes, more than llamad accepts \
\(max_text = %d bytes); nothing was sent" (length bytes) max-text)))
         (setf (llamad-generation-marker gen)
               (or marker (llamad--answer-marker session prompt)))
         (when (and (null marker) (not noninteractive))
           (display-buffer (marker-buffer (llamad-generation-marker gen))))
         (with-current-buffer (marker-buffer (llamad-generation-marker gen))
           (setq llamad--generation gen))
         (push gen llamad--generations)
         (llamad--request
          conn :open (list :session session)
          (lambda (kind body)
            (pcase kind
              (:session (llamad--start gen bytes))
              (:closed (llamad--end gen 'closed body))
              (:error (llamad--end gen 'error (llamad--error-text body) t))
              (_ (llamad--end gen 'error (format "llamad: unexpected reply %s" kind) t))))))))
    gen))

(defun llamad--start (gen bytes)
  "Send GEN's Generate, the prompt being the UTF-8 BYTES."
  (if (llamad-generation-cancel gen)
      (progn (message "llamad: cancelled before the answer started")
             (llamad--end gen 'done nil))
    (let ((conn (llamad-generation-conn gen)))
      (setf (llamad-generation-state gen) 'running
            (llamad-generation-id gen)
            (llamad--request
             conn :generate
             `(:session ,(llamad-generation-session gen) :prompt ,bytes
               ,@(llamad-generation-options gen))
             (lambda (kind body) (llamad--on-reply gen kind body))
             t)))))

(defun llamad--on-reply (gen kind body)
  "Handle the reply (KIND BODY) to GEN's Generate."
  (pcase kind
    (:token (llamad--insert gen (or (plist-get body :text) "")))
    (:done (setf (llamad-generation-done gen) body)
           (llamad--end gen 'done nil t))
    (:error (llamad--end gen 'error (llamad--error-text body) t))
    (:closed (llamad--end gen 'closed body))))

(defun llamad--insert (gen text)
  "Add TEXT, a token event's, to GEN and its buffer."
  (cl-incf (llamad-generation-events gen))
  (unless (string= text "")
    (push text (llamad-generation-parts gen))
    (let* ((m (llamad-generation-marker gen))
           (buf (marker-buffer m)))
      (when buf
        (with-current-buffer buf
          (let ((inhibit-read-only t)
                (old (marker-position m)))
            (save-excursion
              (goto-char m)
              (insert text))
            (dolist (w (get-buffer-window-list buf nil t))
              (when (= (window-point w) old)
                (set-window-point w m))))))))
  (when llamad-token-functions
    (run-hook-with-args 'llamad-token-functions gen text))
  (when (and llamad-record-latency llamad--chunk-time)
    (let ((now (float-time)))
      (push (cons (- now llamad--chunk-time) (- now (or llamad--event-start now)))
            llamad-latency-samples))))

(defun llamad--end (gen state why &optional say)
  "End GEN in STATE; WHY is the error text.  With SAY, show how it ended."
  (setf (llamad-generation-state gen) state
        (llamad-generation-error gen) why)
  (setq llamad--generations (delq gen llamad--generations))
  (let* ((done (llamad-generation-done gen))
         (reason (and done (plist-get done :reason))))
    (when say
      (cond
       (why (message "%s%s" why (if (llamad-generation-parts gen)
                                    "; the partial text is kept" "")))
       ((eql reason 5)
        (message "llamad: cancelled; the partial answer stays in session %s"
                 (llamad-generation-session gen)))
       (done
        (message "llamad: %d tokens (%s) in session %s"
                 (or (plist-get done :generated-tokens) 0)
                 (downcase (llamad-proto-enum-name 'StopReason (or reason 0)))
                 (llamad-generation-session gen))))))
  (run-hook-with-args 'llamad-answer-end-functions gen))

;;;; Commands

;;;###autoload
(defun llamad-send (beg end &optional at-point)
  "Send the region BEG..END (or the buffer) as a user turn; stream the answer.
Interactively, the active region or else the whole buffer.  The answer
goes into the session's answer buffer; with a prefix argument AT-POINT,
at point in this buffer instead."
  (interactive
   (if (use-region-p)
       (list (region-beginning) (region-end) current-prefix-arg)
     (list (point-min) (point-max) current-prefix-arg)))
  (let ((text (buffer-substring-no-properties beg end))
        (marker (and at-point (copy-marker (point) t))))
    (when (string-match-p "\\`[ \t\n]*\\'" text)
      (user-error "llamad: nothing to send"))
    (deactivate-mark)
    (llamad-generate text nil marker)))

;;;###autoload
(defun llamad-send-buffer (&optional at-point)
  "Send the whole buffer as a user turn; AT-POINT as for `llamad-send'."
  (interactive "P")
  (llamad-send (point-min) (point-max) at-point))

;;;###autoload
(defun llamad-cancel ()
  "Stop the answer being generated; the part so far stays in the session.
In an answer buffer, its answer; elsewhere, the newest one running."
  (interactive)
  (let ((gen (or (and llamad--generation
                      (memq llamad--generation llamad--generations)
                      llamad--generation)
                 (car llamad--generations))))
    (unless gen
      (user-error "llamad: no answer is being generated"))
    (if (not (llamad-generation-id gen))
        (setf (llamad-generation-cancel gen) t)
      (let ((conn (llamad-generation-conn gen)))
        (when (llamad--conn-closed conn)
          (user-error "llamad: the connection of that answer is closed"))
        (llamad--request
         conn :cancel (list :request-id (llamad-generation-id gen))
         (lambda (kind body)
           ;; UNKNOWN_REQUEST: it ended on its own meanwhile
           (when (and (eq kind :error) (not (eql (plist-get body :code) 11)))
             (message "%s" (llamad--error-text body)))))))))

(defun llamad--use-session (session)
  "Make SESSION the session of the current project."
  (puthash (llamad-project-directory) session llamad--project-sessions))

;;;###autoload
(defun llamad-switch-session (session)
  "Use SESSION for the current project (created on the next turn if new)."
  (interactive
   (list (completing-read (format "Session (now %s): " (llamad-current-session))
                          llamad--known-sessions)))
  (llamad--check-session-id session)
  (llamad--use-session session)
  (message "llamad: session %s" session))

;;;###autoload
(defun llamad-fork (target)
  "Fork the current session into TARGET and continue in TARGET."
  (interactive
   (list (read-string (format "Fork %s into: " (llamad-current-session))
                      (format "%s-fork" (llamad-current-session)))))
  (llamad-fork-session (llamad-current-session) target
                       (lambda (_info)
                         (message "llamad: forked into %s, now in use" target))))

(defun llamad-fork-session (source target &optional callback)
  "Fork SOURCE into TARGET, make TARGET the project's session; call CALLBACK.
CALLBACK gets TARGET's SessionInfo plist; errors are shown as messages."
  (llamad--check-session-id source)
  (llamad--check-session-id target)
  (let ((dir default-directory))
    (llamad--call :fork (list :session source :target target) :session
                  (lambda (info err)
                    (if err
                        (message "%s" err)
                      (let ((default-directory dir))
                        (llamad--use-session target))
                      (when callback (funcall callback info)))))))

(defconst llamad--max-list-pages 1000
  "The most ListSessions pages one listing asks for.
A daemon that keeps answering `next' cannot keep Emacs asking forever.")

(defun llamad-list (callback)
  "Call CALLBACK with the list of SessionInfo plists of the daemon's sessions.
The daemon answers a page at a time (as many sessions as fit one frame,
by name); while a page has `next', the page after it is asked for
\(ListSessions `after'), `llamad--max-list-pages' pages at most.
Errors are shown as messages, and CALLBACK is not called then."
  (let ((acc nil) (pages 0))
    (cl-labels
        ((page (after)
           (llamad--call
            :list (and after (list :after after)) :sessions
            (lambda (list err)
              (if err
                  (message "%s" err)
                (dolist (s (plist-get list :sessions))
                  (push s acc))
                (cl-incf pages)
                (let ((next (plist-get list :next)))
                  (cond
                   ((null next)
                    (let ((sessions (nreverse acc)))
                      (setq llamad--known-sessions
                            (mapcar (lambda (s) (plist-get s :session)) sessions))
                      (funcall callback sessions)))
                   ((equal next after)
                    (message "llamad: the session list did not advance after %d \
pages (%d sessions)" pages (length acc)))
                   ((>= pages llamad--max-list-pages)
                    (message "llamad: the session list goes on past %d pages \
\(%d sessions); not shown" llamad--max-list-pages (length acc)))
                   (t (page next)))))))))
      (page nil))))

(defvar llamad-sessions-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "RET") #'llamad-sessions-switch)
    map)
  "Keys of `llamad-sessions-mode'.")

(define-derived-mode llamad-sessions-mode tabulated-list-mode "llamad sessions"
  "The daemon's sessions; RET makes the one at point the project's session.
\\{llamad-sessions-mode-map}"
  (setq tabulated-list-sort-key '("Last use" . t))
  (llamad--sessions-format 7)
  (add-hook 'tabulated-list-revert-hook #'llamad--sessions-revert nil t))

(defun llamad--sessions-format (width)
  "Set the listing's columns, the session names WIDTH characters wide."
  (setq tabulated-list-format
        (vector (list "Session" width t) '("Tokens" 7 t :right-align t)
                '("Turns" 6 t :right-align t) '("Where" 5 t) '("Saved" 5 t)
                '("Last use" 19 t) '("Busy" 4 t)))
  (tabulated-list-init-header))

(defun llamad--sessions-revert ()
  "Fetch the session list again into the current buffer."
  (let ((buf (current-buffer)))
    (llamad-list (lambda (sessions) (llamad--sessions-show buf sessions)))))

(defun llamad--sessions-show (buf sessions)
  "Show SESSIONS (SessionInfo plists) in the listing buffer BUF."
  (when (buffer-live-p buf)
    (with-current-buffer buf
      (llamad--sessions-format
       (apply #'max 7 (mapcar (lambda (s) (length (plist-get s :session))) sessions)))
      (setq tabulated-list-entries
            (mapcar
             (lambda (s)
               (let ((ms (or (plist-get s :last-use-ms) 0)))
                 (list (plist-get s :session)
                       (vector (plist-get s :session)
                               (number-to-string (or (plist-get s :tokens) 0))
                               (number-to-string (or (plist-get s :turns) 0))
                               (llamad-proto-enum-name 'Location
                                                       (or (plist-get s :location) 0))
                               (if (plist-get s :saved) "yes" "no")
                               (format-time-string "%Y-%m-%d %H:%M:%S" (/ ms 1000))
                               (if (plist-get s :busy) "yes" "")))))
             sessions))
      (tabulated-list-print t))))

;;;###autoload
(defun llamad-list-sessions ()
  "List the daemon's sessions in a buffer, where RET makes one current."
  (interactive)
  (let ((dir default-directory))
    (llamad-list (lambda (sessions)
                   (with-current-buffer (get-buffer-create "*llamad sessions*")
                     (unless (derived-mode-p 'llamad-sessions-mode)
                       (llamad-sessions-mode))
                     (setq default-directory dir)
                     (llamad--sessions-show (current-buffer) sessions)
                     (display-buffer (current-buffer)))))))

(defun llamad-sessions-switch ()
  "Make the session at point the session of the listing's project."
  (interactive)
  (let ((id (tabulated-list-get-id)))
    (unless id
      (user-error "llamad: no session on this line"))
    (llamad-switch-session id)))

;;;; Transcripts

(defun llamad-get-transcript (session last callback &optional token-ids)
  "Fetch SESSION's last LAST turns (0 or nil: all) and call CALLBACK.
CALLBACK gets (TURNS TRANSCRIPT): the Turn plists, oldest first, and the
first page's Transcript plist.  With TOKEN-IDS, turns hold their token
ids too.  Pages (replies fit one frame) are followed through `next'.
Errors are shown as messages."
  (let (turns first)
    (cl-labels
        ((page (value)
           (llamad--call
            :transcript value :transcript
            (lambda (tr err)
              (if err
                  (message "%s" err)
                (let ((from (or (plist-get value :from-turn) 0))
                      (next (or (plist-get tr :next) 0))
                      (total (or (plist-get tr :turns) 0)))
                  (unless first
                    (setq first tr))
                  (setq turns (append turns (plist-get tr :items)))
                  (cond ((>= next total) (funcall callback turns first))
                        ((<= next from)
                         (message "llamad: the transcript of %s did not advance \
at turn %d" session next))
                        (t (page (list :session session :from-turn next
                                       :token-ids token-ids))))))))))
      (page (list :session session :last-turns (and last (> last 0) last)
                  :token-ids token-ids)))))

(defvar-local llamad--transcript-args nil
  "In a transcript buffer: (SESSION LAST), to show it again.")

(defvar-local llamad-transcript-turns-shown nil
  "In a transcript buffer: the Turn plists shown.")

(define-derived-mode llamad-transcript-mode special-mode "llamad transcript"
  "A session's turns; g fetches them again."
  (setq-local revert-buffer-function
              (lambda (&rest _) (apply #'llamad-transcript-show llamad--transcript-args))))

(defun llamad-transcript-show (session last)
  "Show SESSION's last LAST turns in a buffer (LAST 0: all)."
  (llamad-get-transcript
   session last
   (lambda (turns tr)
     (let ((buf (get-buffer-create (format "*llamad transcript: %s*" session))))
       (with-current-buffer buf
         (llamad-transcript-mode)
         (setq llamad--transcript-args (list session last)
               llamad-transcript-turns-shown turns)
         (let ((inhibit-read-only t))
           (erase-buffer)
           (insert (format "Session %s: %d turns, %s template%s\n"
                           session (or (plist-get tr :turns) 0)
                           (llamad-proto-enum-name 'Template (or (plist-get tr :template) 0))
                           (if (plist-get tr :busy) ", generating" "")))
           (when (plist-get tr :system)
             (insert (propertize (format "system: %s\n" (plist-get tr :system))
                                 'face 'shadow)))
           (dolist (turn turns)
             (insert (propertize
                      (format "\n── #%d %s, %d tokens%s%s\n"
                              (or (plist-get turn :index) 0)
                              (llamad-proto-enum-name 'Role (or (plist-get turn :role) 0))
                              (or (plist-get turn :tokens) 0)
                              (if (plist-get turn :stop-reason)
                                  (format ", %s" (downcase (llamad-proto-enum-name
                                                            'StopReason
                                                            (plist-get turn :stop-reason))))
                                "")
                              (if (plist-get turn :truncated) ", cut to fit" ""))
                      'face 'bold)
                     (or (plist-get turn :text) "") "\n"))
           (goto-char (point-min))))
       (display-buffer buf)))))

;;;###autoload
(defun llamad-transcript (&optional last)
  "Show the current session's last LAST turns (prefix argument).
Without one, `llamad-transcript-turns' of them."
  (interactive "P")
  (llamad-transcript-show (llamad-current-session)
                          (if last (prefix-numeric-value last) llamad-transcript-turns)))

;;;###autoload
(defun llamad-disconnect ()
  "Close the connection to the daemon (the next command opens a new one)."
  (interactive)
  (when llamad--conn
    (llamad--drop llamad--conn "llamad: disconnected")))

;;;; Keys

(defvar llamad-command-map
  (let ((map (make-sparse-keymap)))
    (define-key map "s" #'llamad-send)
    (define-key map "b" #'llamad-send-buffer)
    (define-key map "k" #'llamad-cancel)
    (define-key map "f" #'llamad-fork)
    (define-key map "t" #'llamad-transcript)
    (define-key map "l" #'llamad-list-sessions)
    (define-key map "w" #'llamad-switch-session)
    map)
  "The llamad commands, for a prefix key of your choice.")
(fset 'llamad-command-map llamad-command-map)

(defvar llamad-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "C-c =") 'llamad-command-map)
    map)
  "Keys of `llamad-mode': `llamad-command-map' on a prefix key.")

;;;###autoload
(define-minor-mode llamad-mode
  "Global minor mode putting `llamad-command-map' on a prefix key.
\\{llamad-mode-map}
The commands under it:
\\{llamad-command-map}"
  :global t
  :lighter nil
  :keymap llamad-mode-map
  :group 'llamad)

(provide 'llamad)
;;; llamad.el ends here
