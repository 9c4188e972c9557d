;;; llamad-test.el --- ERT tests of the Emacs package llamad.el  -*- lexical-binding: t -*-

;; Run by tests/integration/emacs.sh, which starts the daemons and sets:
;;   LLAMAD_TEST_LLAMAD, LLAMAD_TEST_LLAMACTL  the binaries
;;   LLAMAD_TEST_ARGS     the daemon's --model/--tokenizer arguments
;;   LLAMAD_TEST_DIR      a scratch folder (fake servers, restarted daemon)
;;   LLAMAD_TEST_SOCK_A   a daemon with the default limits
;;   LLAMAD_TEST_SOCK_B   a daemon with --max-text 64 --max-frame 1024
;;   LLAMAD_TEST_SOCK_C, LLAMAD_TEST_PID_C  a daemon the tests kill and restart
;;   LLAMAD_TEST_SOCK_D   a daemon with --max-frame 1024 holding the sessions
;;     named in the file LLAMAD_TEST_LIST_NAMES (one a line)
;;   LLAMAD_TEST_PROJECT, LLAMAD_TEST_PROJECT_NAME  a project folder (with
;;     .git) and its session name computed by the shell (sha256sum)
;; Every wait is bounded.  Timing lines start with "LATENCY".

;;; Code:

(require 'ert)
(require 'cl-lib)
(require 'llamad)

(defun lt-env (name)
  "Return the environment variable NAME, which the runner must set."
  (or (getenv name) (error "%s is not set (run tests/integration/emacs.sh)" name)))

(defun lt-wait (pred &optional secs)
  "Process input until PRED returns non-nil or SECS (default 10) pass."
  (let ((end (+ (float-time) (or secs 10))))
    (while (and (not (funcall pred)) (< (float-time) end))
      (accept-process-output nil 0.01))
    (funcall pred)))

(defun lt-ended (gen)
  "Non-nil when GEN has ended."
  (memq (llamad-generation-state gen) '(done error closed refused)))

(defvar lt-messages nil "Messages shown, newest first (see `lt-capture').")

(defun lt-capture (orig fmt &rest args)
  "Record the message FMT ARGS in `lt-messages', then show it (ORIG)."
  (when fmt
    (push (apply #'format-message fmt args) lt-messages))
  (apply orig fmt args))
(advice-add 'message :around #'lt-capture)

(defun lt-llamad-messages ()
  "The messages of the package shown so far in this test, oldest first."
  (reverse (cl-remove-if-not (lambda (m) (string-match-p "llamad" m)) lt-messages)))

(defmacro lt-with (socket &rest body)
  "Run BODY talking greedily to the daemon at SOCKET, capturing messages."
  (declare (indent 1))
  `(let ((llamad-socket ,socket)
         (llamad-temperature 0)
         (llamad-max-tokens 40)
         (llamad-stop nil)
         (llamad-session nil))
     (setq lt-messages nil)
     (clrhash llamad--project-sessions)
     (unwind-protect (progn ,@body)
       (llamad-disconnect))))

(defun lt-generate (prompt session &optional marker secs)
  "Generate the answer to PROMPT in SESSION and wait for its end."
  (let ((gen (llamad-generate prompt session marker)))
    (should (lt-wait (lambda () (lt-ended gen)) (or secs 20)))
    gen))

(defun lt-call (fn &rest args)
  "Call FN with ARGS and a callback; wait for the callback; return its args."
  (let (result)
    (apply fn (append args (list (lambda (&rest r) (setq result (or r '(nil)))))))
    (should (lt-wait (lambda () result) 10))
    result))

(defun lt-llamactl (socket &rest args)
  "Run llamactl on SOCKET with ARGS; return its standard output."
  (with-temp-buffer
    (let* ((coding-system-for-read 'utf-8-unix)
           (rc (apply #'call-process (lt-env "LLAMAD_TEST_LLAMACTL") nil
                      (list t nil) nil "--socket" socket args)))
      (should (eql rc 0))
      (buffer-string))))

(defun lt-transcript (session &optional last)
  "SESSION's turns (the last LAST), through the package."
  (car (lt-call #'llamad-get-transcript session last)))

(defun lt-bytes (&rest bytes)
  "The unibyte string of BYTES."
  (apply #'unibyte-string bytes))

;;;; The codec

(ert-deftest llamad-test-proto-examples ()
  "The byte-level examples of llamad-protocol(7), both ways."
  (should (equal (llamad-proto-frame 'Request '(:id 1 :hello (:protocol-version 1)))
                 (lt-bytes 0 0 0 6 #x08 1 #x12 2 #x08 1)))
  (should (equal (llamad-proto-frame
                  'Request '(:id 3 :generate (:session "s" :prompt "Once upon a time"
                                              :max-tokens 2 :sampler (:temperature 0))))
                 (concat (lt-bytes 0 0 0 #x22 8 3 #x2a #x1e #x0a 1 ?s #x12 #x10)
                         "Once upon a time"
                         (lt-bytes #x20 2 #x2a 5 #x0d 0 0 0 0))))
  (should (equal (llamad-proto-decode 'Response (lt-bytes 8 3 #x32 7 #x0a 1 ?, #x12 2 #xb0 3))
                 '(:id 3 :token (:text "," :tokens (432)))))
  (should (equal (llamad-proto-frame 'Request '(:id 2 :list nil))
                 (lt-bytes 0 0 0 4 8 2 #x42 0)))
  ;; Cancel by session (field 2), both ways
  (should (equal (llamad-proto-encode 'Request '(:id 4 :cancel (:session "s")))
                 (lt-bytes 8 4 #x6a 3 #x12 1 ?s)))
  (should (equal (llamad-proto-decode 'Request (lt-bytes 8 4 #x6a 3 #x12 1 ?s))
                 '(:id 4 :cancel (:session "s")))))

(ert-deftest llamad-test-proto-values ()
  "Varints to 64 bits, signed values, floats, doubles, strings, packed."
  (dolist (n (list 0 1 127 128 300 #xffffffff (1- (ash 1 63)) (1- (ash 1 64))))
    (should (equal (llamad-proto-decode 'Cancel (llamad-proto-encode 'Cancel (list :request-id n)))
                   (list :request-id n))))
  (should (equal (llamad-proto--varint (1- (ash 1 64)))
                 (lt-bytes 255 255 255 255 255 255 255 255 255 1)))
  ;; int32 -1: ten bytes on the wire, read back as -1
  (let ((b (llamad-proto-encode 'SamplerOptions '(:top-k -1 :repeat-last-n -2))))
    (should (= (length b) 22))
    (should (equal (llamad-proto-decode 'SamplerOptions b) '(:top-k -1 :repeat-last-n -2))))
  (should (equal (llamad-proto-decode 'SessionInfo (concat (lt-bytes #x38) (llamad-proto--varint -5)))
                 '(:last-use-ms -5)))
  (dolist (x '(0.0 1.0 -2.5 0.5 1e30 -1e-40 1e-45 3.4028234663852886e38))
    (let ((got (plist-get (llamad-proto-decode
                           'SamplerOptions (llamad-proto-encode 'SamplerOptions (list :top-p x)))
                          :top-p)))
      (should (< (abs (- got x)) (max 1e-45 (* (abs x) 1e-7))))))
  (should (equal (llamad-proto-encode 'SamplerOptions '(:temperature 0.8))
                 (lt-bytes #x0d #xcd #xcc #x4c #x3f)))
  (should (= (plist-get (llamad-proto-decode 'SamplerOptions (lt-bytes #x0d 0 0 #x80 #x7f))
                        :temperature)
             1.0e+INF))
  (should (= (plist-get (llamad-proto-decode 'Done (lt-bytes #x21 0 0 0 0 0 0 #xf8 #x3f)) :prefill-ms)
             1.5))
  (dolist (x '(0.1 -123.456 1e300 5e-324 2.2250738585072014e-308))
    (should (= x (llamad-proto--ieee-value (llamad-proto--ieee-bits x 52 11) 52 11))))
  (should (equal (llamad-proto-decode 'Error (llamad-proto-encode 'Error '(:code 7 :message "é ✓ 日本")))
                 '(:code 7 :message "é ✓ 日本")))
  ;; packed, and the same field unpacked (decoders accept both)
  (should (equal (llamad-proto-decode 'TokenEvent (lt-bytes #x12 3 1 #xac 2 #x10 5 #x12 1 7))
                 '(:tokens (1 300 5 7))))
  (should (equal (llamad-proto-decode 'Generate (llamad-proto-encode 'Generate '(:stop ("a" "bc"))))
                 '(:stop ("a" "bc")))))

(ert-deftest llamad-test-proto-unknown-and-malformed ()
  "Unknown fields of every wire type are skipped; bad input signals."
  (let ((unknown (lt-bytes #xc8 #x01 #x96 #x01              ; 25 varint 150
                           #xd1 #x01 1 2 3 4 5 6 7 8          ; 26 fixed64
                           #xda #x01 3 ?a ?b ?c               ; 27 bytes
                           #xe3 #x01 #x08 1 #x12 1 ?x         ; 28 group ...
                           #xeb #x01 #x08 2 #xec #x01 #xe4 #x01 ; nested 29, end 28
                           #xed #x01 1 2 3 4)))               ; 29 fixed32
    (should (equal (llamad-proto-decode 'Response (concat unknown (lt-bytes 8 9))) '(:id 9)))
    ;; inside a known message, around its known field
    (let ((token (concat unknown (lt-bytes #x0a 1 ?x) unknown)))
      (should (equal (llamad-proto-decode 'Response (concat (lt-bytes #x32 (length token)) token))
                     '(:token (:text "x"))))))
  (dolist (bad (list (lt-bytes #x08)                  ; truncated varint
                     (lt-bytes #x08 255 255 255 255 255 255 255 255 255 255 1) ; 11 bytes
                     (lt-bytes #x0f 1)                ; wire type 7
                     (lt-bytes #x12 5 1 2)            ; length past the end
                     (lt-bytes #x09 1 2 3)            ; truncated fixed64
                     (lt-bytes #x0c)                  ; end group without start
                     (lt-bytes #x12 2 #x08)           ; nested truncated
                     (lt-bytes #x0a 1 1)              ; id as bytes
                     (lt-bytes 0 1)))                 ; field 0
    (should-error (llamad-proto-decode 'Response bad) :type 'llamad-proto-error)))

(ert-deftest llamad-test-framing ()
  "Frames split anywhere, or many per chunk, reach their callbacks in order."
  (let* ((conn (llamad--conn-make :socket "none"))
         (frames (apply #'concat
                        (mapcar (lambda (i)
                                  (llamad-proto-frame
                                   'Response (list :id 5 :token
                                                   (list :text (format "t%d é" i) :tokens (list i)))))
                                (number-sequence 1 50))))
         got)
    (puthash 5 (cons (lambda (_k body) (push (plist-get body :text) got)) t)
             (llamad--conn-handlers conn))
    ;; byte by byte, then in chunks of growing sizes
    (dotimes (i (length frames))
      (llamad--receive conn (substring frames i (1+ i))))
    (let ((i 0) (n 1))
      (while (< i (length frames))
        (llamad--receive conn (substring frames i (min (length frames) (+ i n))))
        (setq i (+ i n) n (1+ (* 2 n)))))
    (should (equal (nreverse got)
                   (append (mapcar (lambda (i) (format "t%d é" i)) (number-sequence 1 50))
                           (mapcar (lambda (i) (format "t%d é" i)) (number-sequence 1 50)))))
    (should-not (llamad--conn-closed conn))))

;;;; Against the daemon

(ert-deftest llamad-test-same-as-llamactl ()
  "The streamed text equals llamactl's for the same session state."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_A")
    (let ((base (lt-generate "Once upon a time" "eq-base")))
      (should (eq (llamad-generation-state base) 'done))
      (dolist (s '("eq-a" "eq-b" "eq-c"))
        (should (equal (plist-get (car (lt-call #'llamad-fork-session "eq-base" s)) :session) s))))
    (let* ((llamad-max-tokens 80)
           (want (lt-llamactl (lt-env "LLAMAD_TEST_SOCK_A") "generate" "--session" "eq-a"
                              "--temperature" "0" "-n" "80" "Where did she go?"))
           (gen (lt-generate "Where did she go?" "eq-b"))
           (text (llamad-generation-text gen)))
      (should (eq (llamad-generation-state gen) 'done))
      (should (> (length text) 20))
      (should (equal (concat text "\n") want))
      (should (= (llamad-generation-events gen)
                 (plist-get (llamad-generation-done gen) :generated-tokens)))
      ;; it is in the answer buffer, after the prompt line
      (with-current-buffer "*llamad: eq-b*"
        (should (eq major-mode 'llamad-answer-mode))
        (should (eq (key-binding (kbd "C-c C-k")) 'llamad-cancel))
        (should (string-suffix-p (concat "── you: Where did she go?\n" text) (buffer-string))))
      ;; at point: the same answer goes into this buffer at the marker
      (with-temp-buffer
        (insert "before\nafter")
        (goto-char 8)
        (let ((gen2 (lt-generate "Where did she go?" "eq-c" (copy-marker (point) t))))
          (should (eq (llamad-generation-state gen2) 'done))
          (should (equal (buffer-string) (concat "before\n" text "after"))))))))

(ert-deftest llamad-test-send-command ()
  "M-x llamad-send with a region sends it into the project's session."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_A")
    (let* ((default-directory (file-name-as-directory (lt-env "LLAMAD_TEST_PROJECT")))
           (session (llamad-current-session))
           gen)
      (should (equal session (lt-env "LLAMAD_TEST_PROJECT_NAME")))
      (with-temp-buffer
        (insert "ignored\nTell me about the sun.\nignored too")
        (transient-mark-mode 1)
        (goto-char 9) (push-mark 32 t t)
        (should (equal (buffer-substring (region-beginning) (region-end)) "Tell me about the sun.\n"))
        (setq gen (call-interactively #'llamad-send)))
      (should (lt-wait (lambda () (lt-ended gen)) 20))
      (should (equal (llamad-generation-session gen) session))
      (let ((turns (lt-transcript session 2)))
        (should (equal (plist-get (car turns) :text) "Tell me about the sun.\n"))
        (should (equal (plist-get (cadr turns) :text) (llamad-generation-text gen)))))))

(defun lt-cancel-once (session)
  "Generate in SESSION and cancel it after its first token; return the generation.
The daemon is stopped (SIGSTOP) while the Cancel is sent, so that the
answer cannot finish first."
  (let* ((pid (string-to-number (lt-env "LLAMAD_TEST_PID_A")))
         (hook (lambda (gen _text)
                 (when (= (llamad-generation-events gen) 1)
                   (signal-process pid 'SIGSTOP)
                   (with-current-buffer (marker-buffer (llamad-generation-marker gen))
                     (llamad-cancel))
                   (signal-process pid 'SIGCONT))))
         (llamad-max-tokens 450))
    (add-hook 'llamad-token-functions hook)
    (unwind-protect (lt-generate "Once upon a time there was" session)
      (remove-hook 'llamad-token-functions hook)
      (signal-process pid 'SIGCONT))))

(ert-deftest llamad-test-cancel ()
  "A cancelled answer stays in the session, as it was shown."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_A")
    (let ((tries 0) gen)
      (while (and (< tries 3)
                  (progn (setq gen (lt-cancel-once (format "cancel-%d" tries)))
                         (not (eql 5 (plist-get (llamad-generation-done gen) :reason)))))
        (cl-incf tries))
      (message "cancel: took effect at try %d, after %d of at most 450 tokens"
               (1+ tries) (llamad-generation-events gen))
      (should (eq (llamad-generation-state gen) 'done))
      (should (eql 5 (plist-get (llamad-generation-done gen) :reason)))
      (should (< (llamad-generation-events gen) 450))
      (let* ((text (llamad-generation-text gen))
             (last (car (last (lt-transcript (llamad-generation-session gen) 1)))))
        (should (> (length text) 0))
        (should (eql (plist-get last :stop-reason) 5))
        (should (plist-get last :generated))
        (should (equal (plist-get last :text) text))
        (with-current-buffer (marker-buffer (llamad-generation-marker gen))
          (should (string-suffix-p text (buffer-string))))
        (should (member (format "llamad: cancelled; the partial answer stays in session %s"
                                (llamad-generation-session gen))
                        (lt-llamad-messages)))))))

(ert-deftest llamad-test-no-daemon ()
  "No daemon: one clear user-error naming the socket, nothing else."
  (let ((sock (expand-file-name "nothing-here.sock" (lt-env "LLAMAD_TEST_DIR"))))
    (lt-with sock
      (let (errors)
        (with-temp-buffer
          (insert "Hello")
          (condition-case err
              (call-interactively #'llamad-send)
            (user-error (push (cadr err) errors))))
        (condition-case err
            (llamad-list-sessions)
          (user-error (push (cadr err) errors)))
        (lt-wait (lambda () nil) 0.3)
        (should (= (length errors) 2))
        (dolist (e errors)
          (should (string-match-p (regexp-quote sock) e))
          (should (string-match-p "is llamad running" e)))
        (message "no daemon: %s" (car errors))
        (should (equal (lt-llamad-messages) (list (format "no daemon: %s" (car errors)))))))))

(defun lt-start-daemon (socket log)
  "Start llamad on SOCKET (stderr to LOG); return its process."
  (let ((proc (make-process
               :name "llamad-restarted" :noquery t :buffer nil
               :command (list "sh" "-c" (format "exec %s %s --socket %s --state-dir none 2>>%s"
                                                (shell-quote-argument (lt-env "LLAMAD_TEST_LLAMAD"))
                                                (lt-env "LLAMAD_TEST_ARGS")
                                                (shell-quote-argument socket)
                                                (shell-quote-argument log))))))
    (with-temp-file (expand-file-name "restarted.pid" (lt-env "LLAMAD_TEST_DIR"))
      (insert (number-to-string (process-id proc))))
    proc))

(defun lt-kill-during-answer (pid)
  "Generate 450 tokens; at the third, stop the daemon PID with SIGTERM.
Wait until the answer ended and the connection closed; return the
generation.  (SIGSTOP holds the daemon while the SIGTERM is sent, so
that it is stopping mid-answer; it may still finish the answer first.)"
  (let* ((hook (lambda (gen _text)
                 (when (= (llamad-generation-events gen) 3)
                   (signal-process pid 'SIGSTOP)
                   (signal-process pid 'SIGTERM)
                   (signal-process pid 'SIGCONT))))
         (llamad-max-tokens 450)
         gen)
    (add-hook 'llamad-token-functions hook)
    (unwind-protect
        (progn
          (setq gen (llamad-generate "Once upon a time" "killed"))
          (should (lt-wait (lambda ()
                             (and (lt-ended gen)
                                  (llamad--conn-closed (llamad-generation-conn gen))))
                           20))
          gen)
      (remove-hook 'llamad-token-functions hook)
      (signal-process pid 'SIGCONT))))

(ert-deftest llamad-test-daemon-killed ()
  "SIGTERM mid-answer: said once, partial text kept; then a restarted daemon works."
  (let* ((sock (lt-env "LLAMAD_TEST_SOCK_C"))
         (log (expand-file-name "restarted.log" (lt-env "LLAMAD_TEST_DIR")))
         (pid (string-to-number (lt-env "LLAMAD_TEST_PID_C")))
         (tries 0)
         restarted gen msgs)
    (lt-with sock
      (unwind-protect
          (progn
            ;; kill it mid-answer, and start it again; again if the answer
            ;; finished before the daemon stopped (at most 3 times)
            (while (progn
                     (setq lt-messages nil
                           gen (lt-kill-during-answer pid)
                           msgs (lt-llamad-messages))
                     (should (lt-wait (lambda () (not (file-exists-p sock))) 10))
                     (when restarted
                       (delete-process restarted))
                     (setq restarted (lt-start-daemon sock log)
                           pid (process-id restarted))
                     (should (lt-wait (lambda () (file-exists-p sock)) 20))
                     (and (eq (llamad-generation-state gen) 'done) (< (cl-incf tries) 3))))
            (should (memq (llamad-generation-state gen) '(error closed)))
            (let ((text (llamad-generation-text gen)))
              (should (> (length text) 0))
              (should (= (length msgs) 1))
              (should (string-match-p "partial text is kept" (car msgs)))
              (should (string-match-p "SHUTTING_DOWN\\|closed the connection" (car msgs)))
              (message "killed: %s (after %d tokens, try %d)"
                       (car msgs) (llamad-generation-events gen) (1+ tries))
              (with-current-buffer "*llamad: killed*"
                (should (string-suffix-p text (buffer-string)))))
            ;; the next command reconnects
            (setq lt-messages nil)
            (let ((gen2 (lt-generate "Once upon a time" "after-restart")))
              (should (eq (llamad-generation-state gen2) 'done))
              (should-not (eq (llamad-generation-conn gen2) (llamad-generation-conn gen)))
              (should (> (length (llamad-generation-text gen2)) 0))
              (should (equal (lt-llamad-messages)
                             '("llamad: 40 tokens (max_tokens) in session after-restart")))))
        (signal-process pid 'SIGCONT)
        (when restarted
          (delete-process restarted))))))

(ert-deftest llamad-test-max-text ()
  "Text over max_text is refused before sending, the limit named."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_B")
    ;; not connected yet: refused when the Hello reply tells the limit
    (let ((gen (llamad-generate (make-string 65 ?a) "mt")))
      (should (lt-wait (lambda () (lt-ended gen)) 5))
      (should (eq (llamad-generation-state gen) 'refused))
      (should (equal (lt-llamad-messages)
                     '("llamad: the text is 65 bytes, more than llamad accepts (max_text = 64 bytes); nothing was sent"))))
    ;; connected: a user-error at once; bytes count, not characters
    (let* ((conn (llamad--connection))
           (next (llamad--conn-next-id conn))
           err)
      (should (= (llamad--hello conn :max-text) 64))
      (with-temp-buffer
        (insert (make-string 40 ?é))   ; 40 characters, 80 bytes
        (setq err (condition-case e (progn (call-interactively #'llamad-send) nil)
                    (user-error (cadr e)))))
      (should (equal err "llamad: the text is 80 bytes, more than llamad accepts (max_text = 64 bytes); nothing was sent"))
      (should (= next (llamad--conn-next-id conn)))
      (should-not (member "mt" (mapcar (lambda (s) (plist-get s :session))
                                       (car (lt-call #'llamad-list)))))
      ;; at the limit it goes
      (let ((gen (lt-generate (make-string 32 ?é) "mt")))
        (should (eq (llamad-generation-state gen) 'done))))))

(ert-deftest llamad-test-fork-list-transcript ()
  "Fork continues in the fork; sessions are listed; transcripts page."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_B")   ; max_frame 1024: transcripts page
    (let ((default-directory (file-name-as-directory (lt-env "LLAMAD_TEST_PROJECT")))
          (llamad-max-tokens 60)   ; 5 exchanges fit the 512-token context
          texts)
      (should (equal (llamad-current-session) (lt-env "LLAMAD_TEST_PROJECT_NAME")))
      (dotimes (i 5)
        (let ((gen (lt-generate (format "Tell me story number %d." i) nil)))
          (should (eq (llamad-generation-state gen) 'done))
          (push (llamad-generation-text gen) texts)))
      (setq texts (nreverse texts))
      ;; all 10 turns, in more than one page
      (let ((pages 0) turns)
        (cl-letf* ((orig (symbol-function 'llamad--call))
                   ((symbol-function 'llamad--call)
                    (lambda (op &rest args)
                      (when (eq op :transcript) (cl-incf pages))
                      (apply orig op args))))
          ;; with token ids, so that they take more than one frame
          (setq turns (car (lt-call #'llamad-get-transcript (llamad-current-session) 0)))
          (should (= pages 1))
          (setq turns (let (r)
                        (llamad-get-transcript (llamad-current-session) 0
                                               (lambda (tu _tr) (setq r tu)) t)
                        (should (lt-wait (lambda () r) 10))
                        r)))
        (message "transcript: 10 turns with token ids in %d pages (max_frame 1024)" (1- pages))
        (should (= (length turns) 10))
        (dolist (tn turns)
          (should (= (length (plist-get tn :token-ids)) (plist-get tn :tokens))))
        (should (> pages 2))
        (should (equal (mapcar (lambda (tn) (plist-get tn :index)) turns) (number-sequence 0 9)))
        (should (equal (mapcar (lambda (tn) (plist-get tn :text))
                               (cl-remove-if-not (lambda (tn) (plist-get tn :generated)) turns))
                       texts))
        (should (equal (plist-get (nth 2 turns) :text) "Tell me story number 1."))
        (message "transcript: %d bytes of text"
                 (apply #'+ (mapcar (lambda (tn) (string-bytes (plist-get tn :text))) turns))))
      ;; the last 3, and the transcript command's buffer
      (should (equal (mapcar (lambda (tn) (plist-get tn :index))
                             (lt-transcript (llamad-current-session) 3))
                     '(7 8 9)))
      (llamad-transcript 3)
      (let ((buf (format "*llamad transcript: %s*" (llamad-current-session))))
        (should (lt-wait (lambda () (get-buffer buf)) 5))
        (with-current-buffer buf
          (should (= (length llamad-transcript-turns-shown) 3))
          (should (string-match-p (regexp-quote (car (last texts))) (buffer-string)))))
      ;; fork: continue in the fork; the source keeps its 10 turns
      (let ((source (llamad-current-session)))
        (llamad-fork "forked-one")
        (should (lt-wait (lambda () (equal (llamad-current-session) "forked-one")) 5))
        (let* ((llamad-max-tokens 5)
               (gen (lt-generate "And then?" nil)))
          (should (eq (llamad-generation-state gen) 'done))
          (should (equal (llamad-generation-session gen) "forked-one")))
        (should (= (length (lt-transcript "forked-one" 0)) 12))
        (should (= (length (lt-transcript source 0)) 10))
        ;; listing, and switching back from the listing buffer
        (let ((names (mapcar (lambda (s) (plist-get s :session)) (car (lt-call #'llamad-list)))))
          (should (member source names))
          (should (member "forked-one" names)))
        (llamad-list-sessions)
        (should (lt-wait (lambda () (get-buffer "*llamad sessions*")) 5))
        (with-current-buffer "*llamad sessions*"
          (goto-char (point-min))
          (should (search-forward source nil t))
          (llamad-sessions-switch))
        (should (equal (llamad-current-session) source))
        (llamad-switch-session "other-one")
        (should (equal (llamad-current-session) "other-one"))
        (should-error (llamad-switch-session "bad name!") :type 'user-error)))))

(ert-deftest llamad-test-project-name ()
  "The per-project session name, against the shell's sha256sum."
  (let* ((proj (lt-env "LLAMAD_TEST_PROJECT"))
         (sub (expand-file-name "sub/deeper/" proj)))
    (make-directory sub t)
    (should (equal (llamad-project-directory sub) proj))
    (should (equal (llamad-project-session-name sub) (lt-env "LLAMAD_TEST_PROJECT_NAME")))
    (should (equal (llamad-project-session-name (concat proj "/")) (lt-env "LLAMAD_TEST_PROJECT_NAME")))
    ;; nothing left of the name: "project"
    (let ((odd (expand-file-name "日本 ü" (lt-env "LLAMAD_TEST_DIR"))))
      (make-directory odd t)
      (should (equal (llamad-project-session-name odd)
                     (concat "project-" (substring (secure-hash 'sha256 (encode-coding-string odd 'utf-8)) 0 8)))))
    ;; no .git above: the folder itself
    (let ((plain (expand-file-name "plain" (lt-env "LLAMAD_TEST_DIR"))))
      (make-directory plain t)
      (should (equal (llamad-project-directory plain) plain))
      (should (string-match-p "\\`plain-[0-9a-f]\\{8\\}\\'" (llamad-project-session-name plain))))))

(ert-deftest llamad-test-socket-path ()
  "The default sockets, as llamactl finds them: the user's, then the system's."
  (let ((process-environment (copy-sequence process-environment))
        (llamad-socket nil))
    (setenv "LLAMAD_SOCKET" "/x/l.sock")
    (setenv "XDG_RUNTIME_DIR" "/run/user/1000")
    (should (equal (llamad-socket-paths) '("/x/l.sock")))
    (should (equal (llamad-socket-path) "/x/l.sock"))
    (setenv "LLAMAD_SOCKET" "")
    (cl-letf (((symbol-function 'user-uid) (lambda () 1000)))
      (should (equal (llamad-socket-paths)
                     '("/run/user/1000/llamad/llamad.sock" "/run/llamad/llamad.sock")))
      (should (equal (llamad-socket-path) "/run/user/1000/llamad/llamad.sock"))
      (setenv "XDG_RUNTIME_DIR" nil)
      (should (equal (llamad-socket-paths) '("/run/llamad/llamad.sock"))))
    (setenv "XDG_RUNTIME_DIR" "/run/user/0")
    (cl-letf (((symbol-function 'user-uid) (lambda () 0)))
      (should (equal (llamad-socket-paths) '("/run/llamad/llamad.sock"))))
    (let ((llamad-socket "/y/z.sock"))
      (setenv "LLAMAD_SOCKET" "/x/l.sock")
      (should (equal (llamad-socket-paths) '("/y/z.sock")))
      (should (equal (llamad-socket-path) "/y/z.sock")))))

(ert-deftest llamad-test-keys ()
  "llamad-mode puts the commands under C-c =."
  (unwind-protect
      (progn
        (llamad-mode 1)
        (should (eq (key-binding (kbd "C-c = s")) 'llamad-send))
        (should (eq (key-binding (kbd "C-c = k")) 'llamad-cancel))
        (should (eq (key-binding (kbd "C-c = f")) 'llamad-fork))
        (should (eq (key-binding (kbd "C-c = t")) 'llamad-transcript))
        (should (eq (key-binding (kbd "C-c = l")) 'llamad-list-sessions))
        (should (eq (key-binding (kbd "C-c = w")) 'llamad-switch-session)))
    (llamad-mode -1))
  (should-not (eq (key-binding (kbd "C-c = s")) 'llamad-send)))

;;;; Bad replies: a fake server in this Emacs

(defvar lt-fake-count 0)

(defun lt-fake-server (respond)
  "Listen on a new socket; call RESPOND with each client process and Request.
Return the socket path."
  (let ((path (expand-file-name (format "fake-%d.sock" (cl-incf lt-fake-count))
                                (lt-env "LLAMAD_TEST_DIR"))))
    (make-network-process
     :name "fake" :server t :family 'local :service path :coding 'binary :noquery t
     :filter (lambda (proc chunk)
               (let ((buf (concat (or (process-get proc 'buf) "") chunk)))
                 (while (and (>= (length buf) 4)
                             (>= (length buf) (+ 4 (llamad-proto-frame-length buf 0))))
                   (let ((n (llamad-proto-frame-length buf 0)))
                     (when (process-live-p proc)
                       (funcall respond proc (llamad-proto-decode 'Request buf 4 (+ 4 n))))
                     (setq buf (substring buf (+ 4 n)))))
                 (process-put proc 'buf buf))))
    path))

(defun lt-hello-reply (req)
  "A HelloReply frame answering REQ."
  (llamad-proto-frame 'Response (list :id (plist-get req :id)
                                      :hello '(:max-frame 4096 :max-text 1000 :model "fake"))))

(defun lt-session-reply (req)
  "A SessionInfo frame (session \"fake\") answering the OpenSession REQ."
  (llamad-proto-frame 'Response (list :id (plist-get req :id) :session '(:session "fake"))))

(ert-deftest llamad-test-bad-replies ()
  "Oversized and malformed reply frames give an error, never a hang."
  ;; a header announcing 4 GiB, in answer to Hello
  (lt-with (lt-fake-server (lambda (proc _req) (process-send-string proc (lt-bytes 255 255 255 255))))
    (let ((gen (llamad-generate "Hi" "fake")))
      (should (lt-wait (lambda () (lt-ended gen)) 5))
      (should (eq (llamad-generation-state gen) 'closed))
      (should (equal (lt-llamad-messages)
                     (list (format "llamad: the daemon sent a reply frame of 4294967295 bytes, over the limit of %d bytes (llamad-max-reply-bytes); connection closed"
                                   llamad-max-reply-bytes))))))
  ;; over a smaller limit, mid-answer: the partial text is kept
  (lt-with (lt-fake-server
            (lambda (proc req)
              (cond ((plist-member req :hello) (process-send-string proc (lt-hello-reply req)))
                    ((plist-member req :open) (process-send-string proc (lt-session-reply req)))
                    ((plist-member req :generate)
                     (let ((id (plist-get req :id)))
                       ;; a token, then a frame of 2000 bytes sent in pieces
                       (process-send-string proc (llamad-proto-frame
                                                  'Response (list :id id :token '(:text "Once"))))
                       (process-send-string proc (llamad-proto-frame-header 2000))
                       (process-send-string proc (make-string 100 0)))))))
    (let* ((llamad-max-reply-bytes 1000)
           (gen (llamad-generate "Hi" "fake")))
      (should (lt-wait (lambda () (lt-ended gen)) 5))
      (should (eq (llamad-generation-state gen) 'closed))
      (should (equal (llamad-generation-text gen) "Once"))
      (should (equal (lt-llamad-messages)
                     '("llamad: the daemon sent a reply frame of 2000 bytes, over the limit of 1000 bytes (llamad-max-reply-bytes); connection closed; the partial text is kept")))))
  ;; the connection closes mid-answer (no Error first)
  (lt-with (lt-fake-server
            (lambda (proc req)
              (cond ((plist-member req :hello) (process-send-string proc (lt-hello-reply req)))
                    ((plist-member req :open) (process-send-string proc (lt-session-reply req)))
                    ((plist-member req :generate)
                     (process-send-string proc (llamad-proto-frame
                                                'Response (list :id (plist-get req :id)
                                                                :token '(:text "Once upon"))))
                     (delete-process proc)))))
    (let ((gen (llamad-generate "Hi" "fake")))
      (should (lt-wait (lambda () (lt-ended gen)) 5))
      (should (eq (llamad-generation-state gen) 'closed))
      (should (equal (llamad-generation-text gen) "Once upon"))
      (should (equal (lt-llamad-messages)
                     '("llamad closed the connection during the answer; the partial text is kept")))))
  ;; a body that does not decode
  (dolist (body (list (lt-bytes 8 1 #xff) (lt-bytes 8 1 #x1f 0) (lt-bytes 8 1 #x1a 9 1)))
    (lt-with (lt-fake-server
              (lambda (proc _req)
                (process-send-string proc (concat (llamad-proto-frame-header (length body)) body))))
      (let ((result nil))
        (llamad-list (lambda (s) (setq result s)))
        (should (lt-wait (lambda () (lt-llamad-messages)) 5))
        (should (null result))
        (should (null llamad--conn))
        (should (= (length (lt-llamad-messages)) 1))
        (should (string-match-p "\\`llamad: malformed reply from the daemon (.*); connection closed\\'"
                                (car (lt-llamad-messages)))))))
  ;; half a frame, then the server closes
  (lt-with (lt-fake-server (lambda (proc _req)
                             (process-send-string proc (lt-bytes 0 0 0 10 8 1))
                             (delete-process proc)))
    (let ((gen (llamad-generate "Hi" "fake")))
      (should (lt-wait (lambda () (lt-ended gen)) 5))
      (should (equal (lt-llamad-messages)
                     '("llamad closed the connection before answering Hello"))))))

;;;; The session list in pages

(ert-deftest llamad-test-list-pages ()
  "A list over several frames: every session listed once, in both views."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_D")   ; max_frame 1024
    (let ((want (sort (split-string (with-temp-buffer
                                      (insert-file-contents (lt-env "LLAMAD_TEST_LIST_NAMES"))
                                      (buffer-string))
                                    "\n" t)
                      #'string<))
          (pages 0)
          sessions)
      (cl-letf* ((orig (symbol-function 'llamad--call))
                 ((symbol-function 'llamad--call)
                  (lambda (op &rest args)
                    (when (eq op :list) (cl-incf pages))
                    (apply orig op args))))
        (setq sessions (car (lt-call #'llamad-list))))
      (message "sessions: %d listed in %d pages (max_frame 1024)" (length sessions) pages)
      (should (= (length want) 60))
      (should (equal (mapcar (lambda (s) (plist-get s :session)) sessions) want))
      (should (> pages 2))
      (should (null (lt-llamad-messages)))
      (should (equal (sort (copy-sequence llamad--known-sessions) #'string<) want))
      ;; the listing buffer: one line for each
      (when (get-buffer "*llamad sessions*")
        (kill-buffer "*llamad sessions*"))
      (llamad-list-sessions)
      (should (lt-wait (lambda () (get-buffer "*llamad sessions*")) 10))
      (with-current-buffer "*llamad sessions*"
        (should (equal (sort (mapcar #'car tabulated-list-entries) #'string<) want))
        (dolist (name want)
          (should (= (how-many (concat "^" (regexp-quote name) " ") (point-min) (point-max))
                     1)))))))

(defun lt-list-server (page)
  "A fake daemon answering Hello, then each ListSessions.
PAGE is called with the request's `after' and the number of the
request (from 1); it returns the SessionList plist to send.  Return
the socket path."
  (let ((n 0))
    (lt-fake-server
     (lambda (proc req)
       (cond ((plist-member req :hello) (process-send-string proc (lt-hello-reply req)))
             ((plist-member req :list)
              (process-send-string
               proc (llamad-proto-frame
                     'Response (list :id (plist-get req :id)
                                     :sessions (funcall page (plist-get (plist-get req :list) :after)
                                                        (cl-incf n)))))))))))

(ert-deftest llamad-test-list-pages-fake ()
  "Opaque cursors go back as they came; a list that never ends is cut off."
  ;; three pages; a cursor that is no session name, and non-ASCII
  (let* ((c1 (concat "\u00e9" (string 1) " cursor/1"))
         (pages `((nil (:sessions ((:session "page1-a" :system ,(make-string 256 ?s)
                                             :system-cut t)
                                   (:session "page1-b"))
                        :next ,c1))
                  (,c1 (:sessions ((:session "page2-a")) :next "~2~"))
                  ("~2~" (:sessions ((:session "page3-a")))))))
    (lt-with (lt-list-server
              (lambda (after _n)
                (or (cadr (assoc after pages))
                    (error "Unknown cursor %S" after))))
      (let ((sessions (car (lt-call #'llamad-list))))
        (should (equal (mapcar (lambda (s) (plist-get s :session)) sessions)
                       '("page1-a" "page1-b" "page2-a" "page3-a")))
        (should (eq (plist-get (car sessions) :system-cut) t))
        (should (= (length (plist-get (car sessions) :system)) 256))
        (should (null (lt-llamad-messages))))))
  ;; every page has a new next: 1000 pages, then one message, no list
  (let ((asked 0) result)
    (lt-with (lt-list-server
              (lambda (_after n)
                (setq asked n)
                (list :sessions (list (list :session (format "endless-%04d" n)))
                      :next (format "cursor %d" n))))
      (llamad-list (lambda (s) (setq result s)))
      (should (lt-wait (lambda () (lt-llamad-messages)) 60))
      (lt-wait (lambda () nil) 0.2)   ; time to ask more, were it to
      (should (= asked 1000))
      (should (null result))
      (should (equal (lt-llamad-messages)
                     '("llamad: the session list goes on past 1000 pages (1000 sessions); not shown")))))
  ;; next = the cursor just sent: stop at once
  (let ((asked 0) result)
    (lt-with (lt-list-server
              (lambda (_after n)
                (setq asked n)
                '(:sessions ((:session "stuck")) :next "again")))
      (llamad-list (lambda (s) (setq result s)))
      (should (lt-wait (lambda () (lt-llamad-messages)) 10))
      (should (= asked 2))
      (should (null result))
      (should (equal (lt-llamad-messages)
                     '("llamad: the session list did not advance after 2 pages (2 sessions)"))))))

;;;; Latency

(defun lt-percentile (sorted p)
  "The P-th percentile (0..1) of the SORTED list."
  (nth (min (1- (length sorted)) (floor (* p (1- (length sorted))))) sorted))

(ert-deftest llamad-test-latency ()
  "Prints the time the package adds per token event; never fails on timing."
  (lt-with (lt-env "LLAMAD_TEST_SOCK_A")
    (let ((llamad-max-tokens 400)
          (prompt "Once upon a time")
          pkg ctl events)
      ;; (a) in the process filter: receipt of the bytes -> text in the buffer
      ;; (after a garbage collection: the earlier tests' garbage is not the
      ;; package's; the collections during the run are reported)
      (garbage-collect)
      (let ((llamad-record-latency t)
            (gcs gcs-done)
            (gc-time gc-elapsed))
        (setq llamad-latency-samples nil)
        (should (eq (llamad-generation-state (lt-generate prompt "lat-warm")) 'done))
        (setq gcs (- gcs-done gcs) gc-time (- gc-elapsed gc-time))
        (let* ((s llamad-latency-samples)
               (since (sort (mapcar #'car s) #'<))
               (own (sort (mapcar #'cdr s) #'<)))
          (message "LATENCY per event in the package, from the filter receiving the bytes to the text in the buffer (%d events): median %.1f us, p99 %.1f us, max %.1f us"
                   (length s) (* 1e6 (lt-percentile since 0.5)) (* 1e6 (lt-percentile since 0.99))
                   (* 1e6 (car (last since))))
          (message "LATENCY per event, own processing (decode + insert + hooks) (%d events): median %.1f us, p99 %.1f us, max %.1f us; %d garbage collections in the run, %.1f ms"
                   (length s) (* 1e6 (lt-percentile own 0.5)) (* 1e6 (lt-percentile own 0.99))
                   (* 1e6 (car (last own))) gcs (* 1e3 gc-time))
          (setq llamad-latency-samples nil)))
      ;; (b) end to end, connection included: the package vs llamactl, 5 times
      ;; each, fresh sessions (the same greedy tokens)
      (dotimes (i 5)
        (llamad-disconnect)
        (let* ((t0 (float-time))
               (gen (lt-generate prompt (format "lat-pkg-%d" i))))
          (push (- (float-time) t0) pkg)
          (setq events (llamad-generation-events gen)))
        (let ((t0 (float-time)))
          (lt-llamactl (lt-env "LLAMAD_TEST_SOCK_A") "generate" "--session" (format "lat-ctl-%d" i)
                       "--temperature" "0" "-n" "400" prompt)
          (push (- (float-time) t0) ctl)))
      ;; llamactl's own start (exec, dynamic linking), to tell apart
      (let (start)
        (dotimes (_ 5)
          (let ((t0 (float-time)))
            (lt-llamactl (lt-env "LLAMAD_TEST_SOCK_A") "--version")
            (push (- (float-time) t0) start)))
        (let ((p (lt-percentile (sort pkg #'<) 0.5))
              (c (lt-percentile (sort ctl #'<) 0.5))
              (s (lt-percentile (sort start #'<) 0.5)))
          (message "LATENCY end to end, %d token events, median of 5 (connect + Hello + open + generate): package %.2f ms, llamactl %.2f ms (of which %.2f ms is starting llamactl --version); package - llamactl = %.1f us per event, %.1f us per event without the llamactl start"
                   events (* 1e3 p) (* 1e3 c) (* 1e3 s)
                   (/ (* 1e6 (- p c)) events) (/ (* 1e6 (- p (- c s))) events)))))))

(provide 'llamad-test)
;;; llamad-test.el ends here
