;;; llamad-proto.el --- Protobuf codec and framing of the llamad protocol  -*- lexical-binding: t -*-

;; Author: The llamad authors
;; Version: 0.2.0
;; Package-Requires: ((emacs "27.1"))
;; Keywords: comm, tools

;; This file is not part of GNU Emacs.

;;; Commentary:

;; The wire format of llamad(8), written from proto/llamad.proto and
;; llamad-protocol(7): a small Protocol Buffers (proto2) encoder and decoder
;; for exactly the messages llamad.el uses, and the 4-byte big-endian
;; length framing.  It knows no sockets; llamad.el does the talking.
;;
;; Messages are plists with keyword keys named after the proto fields
;; (underscores become dashes): the Request {id: 3, cancel {request_id: 2}}
;; is (:id 3 :cancel (:request-id 2)).  Repeated fields are lists.  Encoding
;; and decoding both follow `llamad-proto-schemas'.  Strings are UTF-8 on
;; the wire: the encoder encodes multibyte strings (a unibyte string is
;; taken as UTF-8 bytes already), the decoder decodes them.  Enum
;; values stay integers; `llamad-proto-enum-name' names them.
;;
;; Decoding skips fields it does not know, of every wire type (varint,
;; 64-bit, length-delimited, groups, 32-bit), as later protocol versions may
;; add fields.  Input that is not a well-formed message signals
;; `llamad-proto-error'.

;;; Code:

(define-error 'llamad-proto-error "Malformed llamad message")

(defconst llamad-proto-schemas
  '((Request
     (1 :id uint64) (2 :hello Hello) (3 :open OpenSession) (5 :generate Generate)
     (6 :fork Fork) (7 :drop Drop) (8 :list ListSessions) (13 :cancel Cancel)
     (16 :transcript GetTranscript))
    (Hello (1 :protocol-version uint32) (2 :client string) (3 :on-behalf-of-uid uint32)
           (4 :caller string))
    (OpenSession
     (1 :session string) (2 :system string) (3 :template enum)
     (4 :context-policy enum) (5 :create-only bool) (6 :ephemeral bool))
    (SamplerOptions
     (1 :temperature float) (2 :top-k int32) (3 :top-p float) (4 :min-p float)
     (5 :repeat-penalty float) (6 :repeat-last-n int32)
     (7 :presence-penalty float) (8 :frequency-penalty float) (9 :seed uint64))
    (Generate
     (1 :session string) (2 :prompt string) (3 :role enum) (4 :max-tokens uint32)
     (5 :sampler SamplerOptions) (6 :stop string repeated))
    (Fork (1 :session string) (2 :target string))
    (Drop (1 :session string))
    (ListSessions (1 :after string))
    (Cancel (1 :request-id uint64) (2 :session string))
    (GetTranscript
     (1 :session string) (2 :from-turn uint32) (3 :last-turns uint32)
     (4 :token-ids bool))
    (Response
     (1 :id uint64) (2 :error Error) (3 :hello HelloReply) (4 :session SessionInfo)
     (5 :sessions SessionList) (6 :token TokenEvent) (7 :done Done) (11 :ok Ok)
     (13 :transcript Transcript))
    (Error (1 :code enum) (2 :message string))
    (HelloReply
     (1 :protocol-version uint32) (2 :server string) (3 :model string)
     (4 :max-frame uint32) (5 :context-length uint32) (6 :max-text uint32)
     (7 :uid uint32) (8 :idle-timeout uint32))
    (SessionInfo
     (1 :session string) (2 :tokens uint32) (3 :cached-tokens uint32)
     (4 :kv-bytes uint64) (5 :kv-blocks uint32) (6 :shared-blocks uint32)
     (7 :last-use-ms int64) (8 :template enum) (9 :context-policy enum)
     (10 :turns uint32) (11 :busy bool) (12 :prefilled-tokens uint64)
     (13 :generated-tokens uint64) (14 :system string) (15 :owner-uid uint32)
     (16 :ephemeral bool) (17 :context-length uint32) (18 :created bool)
     (19 :tokens-added uint32) (20 :location enum) (21 :saved bool)
     (22 :file-bytes uint64) (23 :system-cut bool)
     (24 :computed-tokens uint32) (25 :dropped-turns uint32))
    (SessionList (1 :sessions SessionInfo repeated) (2 :next string))
    (Turn
     (1 :index uint32) (2 :role enum) (3 :text string) (4 :tokens uint32)
     (5 :start uint32) (6 :generated bool) (7 :stop-reason enum)
     (8 :token-ids uint32 packed) (9 :truncated bool) (10 :slid-tokens uint32))
    (Transcript
     (1 :session string) (2 :turns uint32) (3 :first uint32) (4 :next uint32)
     (5 :items Turn repeated) (6 :system string) (7 :template enum)
     (8 :location enum) (9 :busy bool) (10 :dropped-turns uint32)
     (11 :dropped-tokens uint64))
    (TokenEvent (1 :text string) (2 :tokens uint32 packed))
    (Done
     (1 :reason enum) (2 :prompt-tokens uint32) (3 :generated-tokens uint32)
     (4 :prefill-ms double) (5 :generate-ms double) (6 :session-tokens uint32)
     (7 :stop string) (8 :dropped-turns uint32) (9 :dropped-tokens uint32)
     (10 :slid-tokens uint32) (11 :shared-tokens uint32)
     (12 :context-tokens uint32))
    (Ok))
  "The messages of proto/llamad.proto that llamad.el uses.
Each entry is (MESSAGE FIELD...), a FIELD being (NUMBER KEY TYPE [LABEL]):
TYPE is uint32, uint64, int32, int64, bool, enum, string, bytes, float,
double or the name of another message; LABEL is `repeated' or `packed'
\(a packed repeated scalar, which decoding also accepts unpacked).
Fields the proto file has and this list lacks are skipped when decoding.")

(defconst llamad-proto-enums
  '((ErrorCode
     (0 . "ERROR_UNSPECIFIED") (1 . "BAD_REQUEST") (2 . "UNKNOWN_SESSION")
     (3 . "SESSION_EXISTS") (4 . "CONTEXT_FULL") (5 . "BUSY") (6 . "BAD_VERSION")
     (7 . "TOO_LARGE") (8 . "CANCELLED") (9 . "UNKNOWN_OP") (10 . "REFUSED_TEXT")
     (11 . "UNKNOWN_REQUEST") (12 . "PERMISSION_DENIED") (100 . "RESOURCE_EXHAUSTED")
     (101 . "INTERNAL") (102 . "SHUTTING_DOWN") (103 . "STORAGE"))
    (StopReason
     (0 . "UNSPECIFIED") (1 . "EOS") (2 . "MAX_TOKENS") (3 . "STRING")
     (4 . "CONTEXT_FULL") (5 . "CANCELLED"))
    (Role (0 . "user") (1 . "system") (2 . "assistant") (3 . "raw"))
    (Template (0 . "default") (1 . "llama2") (2 . "raw") (3 . "llama3"))
    (Location (0 . "pool") (1 . "ram") (2 . "disk")))
  "Names of the enum values of proto/llamad.proto that llamad.el shows.")

(defun llamad-proto-enum-name (enum value)
  "Return the name of VALUE in ENUM (a key of `llamad-proto-enums').
A value the table does not know is named by its number."
  (or (cdr (assq value (cdr (assq enum llamad-proto-enums))))
      (format "%s(%s)" enum value)))

(defun llamad-proto--fields (message)
  "Return the field list of MESSAGE, a key of `llamad-proto-schemas'."
  (let ((entry (assq message llamad-proto-schemas)))
    (unless entry
      (error "llamad-proto: unknown message type %s" message))
    (cdr entry)))

;;;; Encoding

(defun llamad-proto--varint (n)
  "Return the varint encoding of the integer N as a unibyte string.
A negative N is encoded as its 64-bit two's complement (int32, int64)."
  (when (< n 0)
    (setq n (+ n (ash 1 64))))
  (let (bytes)
    (while (>= n 128)
      (push (logior (logand n 127) 128) bytes)
      (setq n (ash n -7)))
    (push n bytes)
    (apply #'unibyte-string (nreverse bytes))))

(defun llamad-proto--le-bytes (n count)
  "Return the COUNT low bytes of the non-negative integer N, little-endian."
  (let (bytes)
    (dotimes (_ count)
      (push (logand n 255) bytes)
      (setq n (ash n -8)))
    (apply #'unibyte-string (nreverse bytes))))

(defun llamad-proto--ieee-bits (x mant-bits exp-bits)
  "Return the IEEE 754 bits of the number X as an integer.
MANT-BITS is the width of the stored significand (23 single, 52 double),
EXP-BITS that of the exponent (8, 11).  Rounds to nearest."
  (let* ((x (float x))
         (bias (1- (ash 1 (1- exp-bits))))
         (max-exp (1- (ash 1 exp-bits)))
         (sign (if (< (copysign 1.0 x) 0) (ash 1 (+ mant-bits exp-bits)) 0))
         (a (abs x)))
    (cond
     ((isnan x) (logior (ash max-exp mant-bits) (ash 1 (1- mant-bits))))
     ((= a 1.0e+INF) (logior sign (ash max-exp mant-bits)))
     ((= a 0.0) sign)
     (t
      ;; a = m * 2^e with 0.5 <= m < 1, i.e. 1.f * 2^(e - 1)
      (let* ((fr (frexp a))
             (e (+ (cdr fr) bias -1)))
        (if (<= e 0)
            ;; subnormal (or rounds up to the smallest normal, which the
            ;; same bit pattern then spells)
            (logior sign (round (ldexp a (+ bias mant-bits -1))))
          (let ((m (round (ldexp (car fr) (1+ mant-bits)))))
            (when (= m (ash 1 (1+ mant-bits)))  ; rounded up to the next power
              (setq m (ash m -1) e (1+ e)))
            (if (>= e max-exp)
                (logior sign (ash max-exp mant-bits))
              (logior sign (ash e mant-bits)
                      (logand m (1- (ash 1 mant-bits))))))))))))

(defun llamad-proto--encode-value (type value)
  "Return VALUE of the scalar TYPE encoded without its tag (unibyte)."
  (pcase type
    ((or 'uint32 'uint64 'int32 'int64 'enum) (llamad-proto--varint value))
    ('bool (llamad-proto--varint (if value 1 0)))
    ('float (llamad-proto--le-bytes (llamad-proto--ieee-bits value 23 8) 4))
    ('double (llamad-proto--le-bytes (llamad-proto--ieee-bits value 52 11) 8))
    (_ (error "llamad-proto: cannot encode type %s" type))))

(defun llamad-proto--wire-type (type)
  "Return the wire type of fields of TYPE (a message name: 2)."
  (pcase type
    ((or 'uint32 'uint64 'int32 'int64 'enum 'bool) 0)
    ('double 1)
    ('float 5)
    (_ 2)))

(defun llamad-proto--delimited (number bytes)
  "Return field NUMBER holding the unibyte string BYTES, length-delimited."
  (concat (llamad-proto--varint (logior (ash number 3) 2))
          (llamad-proto--varint (length bytes))
          bytes))

(defun llamad-proto--encode-one (number type value)
  "Return one occurrence of field NUMBER of TYPE holding VALUE, tag included."
  (pcase type
    ('string (llamad-proto--delimited
              number (if (multibyte-string-p value)
                         (encode-coding-string value 'utf-8-unix t)
                       value)))
    ('bytes (llamad-proto--delimited number value))
    ((pred (lambda (ty) (assq ty llamad-proto-schemas)))
     (llamad-proto--delimited number (llamad-proto-encode type value)))
    (_ (concat (llamad-proto--varint
                (logior (ash number 3) (llamad-proto--wire-type type)))
               (llamad-proto--encode-value type value)))))

(defun llamad-proto-encode (message plist)
  "Return the message MESSAGE with the fields of PLIST, as a unibyte string.
MESSAGE is a key of `llamad-proto-schemas'.  A key absent from PLIST, or
a scalar key whose value is nil, is not sent; a message-typed key present
with value nil is sent as an empty message (e.g. (:list nil))."
  (let (out)
    (dolist (field (llamad-proto--fields message))
      (let* ((number (nth 0 field)) (key (nth 1 field))
             (type (nth 2 field)) (label (nth 3 field))
             (cell (plist-member plist key))
             (value (cadr cell)))
        (cond
         ((null cell))
         ((eq label 'packed)
          (when value
            (push (llamad-proto--delimited
                   number (mapconcat (lambda (v) (llamad-proto--encode-value type v))
                                     value ""))
                  out)))
         ((eq label 'repeated)
          (dolist (v value)
            (push (llamad-proto--encode-one number type v) out)))
         ((and (null value) (not (assq type llamad-proto-schemas))))
         (t (push (llamad-proto--encode-one number type value) out)))))
    (apply #'concat (nreverse out))))

(defun llamad-proto-frame (message plist)
  "Return MESSAGE with PLIST (see `llamad-proto-encode') as one frame.
A frame is the 4-byte big-endian length of the message, then the message."
  (let ((body (llamad-proto-encode message plist)))
    (concat (llamad-proto-frame-header (length body)) body)))

(defun llamad-proto-frame-header (n)
  "Return the 4-byte big-endian header of a frame of N bytes."
  (unibyte-string (logand (ash n -24) 255) (logand (ash n -16) 255)
                  (logand (ash n -8) 255) (logand n 255)))

(defun llamad-proto-frame-length (s pos)
  "Return the length a frame header announces at POS of the unibyte S."
  (logior (ash (aref s pos) 24) (ash (aref s (+ pos 1)) 16)
          (ash (aref s (+ pos 2)) 8) (aref s (+ pos 3))))

;;;; Decoding

(defvar llamad-proto--pos 0
  "Position of the decoder in the string being decoded.")

(defsubst llamad-proto--fail (what)
  "Signal `llamad-proto-error' saying WHAT is wrong, at the decoder's position."
  (signal 'llamad-proto-error (list (format "%s at byte %d" what llamad-proto--pos))))

(defun llamad-proto--read-varint (s end)
  "Read a varint of S before END at `llamad-proto--pos', and move past it.
Return it as a non-negative integer of at most 64 bits."
  (let ((pos llamad-proto--pos) (shift 0) (n 0) b)
    (while (progn
             (when (>= pos end)
               (llamad-proto--fail "truncated varint"))
             (when (>= shift 70)
               (llamad-proto--fail "varint longer than 10 bytes"))
             (setq b (aref s pos)
                   pos (1+ pos)
                   n (logior n (ash (logand b 127) shift))
                   shift (+ shift 7))
             (>= b 128)))
    (setq llamad-proto--pos pos)
    (if (< shift 63) n (logand n (1- (ash 1 64))))))

(defun llamad-proto--read-le (s end count)
  "Read COUNT bytes of S before END as a little-endian unsigned integer."
  (let ((pos llamad-proto--pos) (n 0))
    (when (> (+ pos count) end)
      (llamad-proto--fail (format "truncated %d-byte field" count)))
    (dotimes (i count)
      (setq n (logior n (ash (aref s (+ pos i)) (* 8 i)))))
    (setq llamad-proto--pos (+ pos count))
    n))

(defun llamad-proto--ieee-value (bits mant-bits exp-bits)
  "Return the float whose IEEE 754 bits are BITS.
MANT-BITS and EXP-BITS are the widths of the fields, as for
`llamad-proto--ieee-bits'."
  (let* ((bias (1- (ash 1 (1- exp-bits))))
         (max-exp (1- (ash 1 exp-bits)))
         (mant (logand bits (1- (ash 1 mant-bits))))
         (e (logand (ash bits (- mant-bits)) max-exp))
         (neg (/= 0 (logand bits (ash 1 (+ mant-bits exp-bits)))))
         (a (cond ((= e max-exp) (if (= mant 0) 1.0e+INF 0.0e+NaN))
                  ((= e 0) (ldexp (float mant) (- 1 bias mant-bits)))
                  (t (ldexp (float (+ mant (ash 1 mant-bits)))
                            (- e bias mant-bits))))))
    (if neg (- a) a)))

(defun llamad-proto--skip-group (s end number)
  "Skip the fields of the group NUMBER of S up to and past its end tag.
END is where the enclosing message ends."
  (let (done)
    (while (not done)
      (let* ((tag (llamad-proto--read-varint s end)))
        (if (and (= (logand tag 7) 4) (= (ash tag -3) number))
            (setq done t)
          (llamad-proto--skip s end tag))))))

(defun llamad-proto--skip (s end tag)
  "Skip the value of the field whose TAG was just read from S, before END."
  (pcase (logand tag 7)
    (0 (llamad-proto--read-varint s end))
    (1 (llamad-proto--read-le s end 8))
    (2 (let ((n (llamad-proto--read-varint s end)))
         (when (> (+ llamad-proto--pos n) end)
           (llamad-proto--fail "truncated length-delimited field"))
         (setq llamad-proto--pos (+ llamad-proto--pos n))))
    (3 (llamad-proto--skip-group s end (ash tag -3)))
    (4 (llamad-proto--fail "unexpected end of group"))
    (5 (llamad-proto--read-le s end 4))
    (_ (llamad-proto--fail (format "invalid wire type %d" (logand tag 7))))))

(defun llamad-proto--scalar (type n)
  "Return the varint N read for a field of TYPE as that type's value."
  (pcase type
    ('uint32 (logand n #xffffffff))
    ('int32 (let ((v (logand n #xffffffff)))
              (if (>= v #x80000000) (- v #x100000000) v)))
    ('int64 (if (>= n (ash 1 63)) (- n (ash 1 64)) n))
    ('bool (/= n 0))
    ('enum (let ((v (logand n #xffffffff)))  ; an int32 on the wire
             (if (>= v #x80000000) (- v #x100000000) v)))
    (_ n)))

(defun llamad-proto--read-value (s end type wire)
  "Read one value of TYPE, sent with wire type WIRE, from S before END."
  (pcase wire
    (0 (if (memq type '(uint32 uint64 int32 int64 bool enum))
           (llamad-proto--scalar type (llamad-proto--read-varint s end))
         (llamad-proto--fail (format "varint for a %s field" type))))
    (1 (if (eq type 'double)
           (llamad-proto--ieee-value (llamad-proto--read-le s end 8) 52 11)
         (llamad-proto--fail (format "64-bit value for a %s field" type))))
    (5 (if (eq type 'float)
           (llamad-proto--ieee-value (llamad-proto--read-le s end 4) 23 8)
         (llamad-proto--fail (format "32-bit value for a %s field" type))))
    (2 (let* ((n (llamad-proto--read-varint s end))
              (a llamad-proto--pos)
              (b (+ a n)))
         (when (> b end)
           (llamad-proto--fail "truncated length-delimited field"))
         (setq llamad-proto--pos b)
         (pcase type
           ('string (decode-coding-string (substring s a b) 'utf-8-unix t))
           ('bytes (substring s a b))
           ((pred (lambda (ty) (assq ty llamad-proto-schemas)))
            (prog1 (llamad-proto-decode type s a b)
              (setq llamad-proto--pos b)))
           (_ (llamad-proto--fail (format "length-delimited %s field" type))))))
    (_ (llamad-proto--fail (format "wire type %d for a %s field" wire type)))))

(defun llamad-proto--read-packed (s end type)
  "Read a packed run of varints of TYPE from S before END; return them."
  (let* ((n (llamad-proto--read-varint s end))
         (stop (+ llamad-proto--pos n))
         values)
    (when (> stop end)
      (llamad-proto--fail "truncated packed field"))
    (unless (memq type '(uint32 uint64 int32 int64 bool enum))
      (llamad-proto--fail (format "packed %s field" type)))
    (while (< llamad-proto--pos stop)
      (push (llamad-proto--scalar type (llamad-proto--read-varint s stop)) values))
    (nreverse values)))

(defun llamad-proto-decode (message s &optional start end)
  "Decode the message MESSAGE from the unibyte string S, bytes START to END.
Return a plist of the fields present (see `llamad-proto-encode'); repeated
fields are lists, in the order received.  Unknown fields are skipped.
Signal `llamad-proto-error' when the bytes are not a well-formed MESSAGE."
  (let ((fields (llamad-proto--fields message))
        (llamad-proto--pos (or start 0))
        (end (or end (length s)))
        plist repeated)
    (while (< llamad-proto--pos end)
      (let* ((tag (llamad-proto--read-varint s end))
             (number (ash tag -3))
             (wire (logand tag 7))
             (field (assq number fields)))
        (when (= number 0)
          (llamad-proto--fail "field number 0"))
        (if (null field)
            (llamad-proto--skip s end tag)
          (let ((key (nth 1 field)) (type (nth 2 field)) (label (nth 3 field)))
            (cond
             ((and (eq label 'packed) (= wire 2))
              (let ((values (llamad-proto--read-packed s end type)))
                (setq plist (plist-put plist key
                                       (nconc (nreverse values) (plist-get plist key))))
                (unless (memq key repeated) (push key repeated))))
             (label
              (let ((v (llamad-proto--read-value s end type wire)))
                (setq plist (plist-put plist key (cons v (plist-get plist key))))
                (unless (memq key repeated) (push key repeated))))
             (t
              (setq plist (plist-put plist key
                                     (llamad-proto--read-value s end type wire)))))))))
    (dolist (key repeated)
      (setq plist (plist-put plist key (nreverse (plist-get plist key)))))
    plist))

(provide 'llamad-proto)
;;; llamad-proto.el ends here
