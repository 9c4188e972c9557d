-- llamad/pb.lua — the wire format of llamad (proto/llamad.proto,
-- llamad-protocol(7)) for the messages this plugin uses: a small
-- schema-driven protocol buffers encoder and decoder, and the framing
-- (4-byte big-endian length + one message).
--
-- Pure Lua 5.1 arithmetic (no `bit`, no ffi), so it runs under LuaJIT and
-- PUC Lua alike. Numbers are Lua numbers (doubles): 64-bit integers are exact
-- up to 2^53, rounded beyond; negative int32/int64 values (10-byte varints)
-- decode exactly. Decoded messages are plain tables keyed by field name; an
-- absent field is nil; repeated fields are arrays; enum values stay numbers
-- (see M.enum_name). Unknown fields of every wire type (groups included) are
-- skipped.

-- LuaJIT: run this module's functions in the interpreter. They handle one
-- event in microseconds either way, but compiling their traces stalls the
-- first events of every answer for hundreds of microseconds each.
if jit then jit.off(true, true) end

local M = {}

local byte, char, sub, concat = string.byte, string.char, string.sub, table.concat
local floor, frexp, ldexp = math.floor, math.frexp, math.ldexp

local TWO32 = 4294967296

-- ---------------------------------------------------------------- schemas --
-- Each message: a list of { number, name, type [, 'repeated'] }; type is a
-- scalar type name or the name of another message. Repeated scalars of
-- numeric types are written packed (proto2 [packed = true] in llamad.proto)
-- and read packed or not.
local defs = {
  Hello = {
    { 1, 'protocol_version', 'uint32' }, { 2, 'client', 'string' },
    { 3, 'on_behalf_of_uid', 'uint32' }, { 4, 'caller', 'string' },
  },
  HelloReply = {
    { 1, 'protocol_version', 'uint32' }, { 2, 'server', 'string' }, { 3, 'model', 'string' },
    { 4, 'max_frame', 'uint32' }, { 5, 'context_length', 'uint32' }, { 6, 'max_text', 'uint32' },
    { 7, 'uid', 'uint32' }, { 8, 'idle_timeout', 'uint32' },
  },
  OpenSession = {
    { 1, 'session', 'string' }, { 2, 'system', 'string' }, { 3, 'template', 'enum' },
    { 4, 'context_policy', 'enum' }, { 5, 'create_only', 'bool' }, { 6, 'ephemeral', 'bool' },
  },
  SamplerOptions = {
    { 1, 'temperature', 'float' }, { 2, 'top_k', 'int32' }, { 3, 'top_p', 'float' },
    { 4, 'min_p', 'float' }, { 5, 'repeat_penalty', 'float' }, { 6, 'repeat_last_n', 'int32' },
    { 7, 'presence_penalty', 'float' }, { 8, 'frequency_penalty', 'float' }, { 9, 'seed', 'uint64' },
  },
  Generate = {
    { 1, 'session', 'string' }, { 2, 'prompt', 'string' }, { 3, 'role', 'enum' },
    { 4, 'max_tokens', 'uint32' }, { 5, 'sampler', 'SamplerOptions' }, { 6, 'stop', 'string', 'repeated' },
  },
  Fork = { { 1, 'session', 'string' }, { 2, 'target', 'string' } },
  ListSessions = { { 1, 'after', 'string' } },
  GetInfo = { { 1, 'session', 'string' } },
  Cancel = { { 1, 'request_id', 'uint64' }, { 2, 'session', 'string' } },
  GetTranscript = {
    { 1, 'session', 'string' }, { 2, 'from_turn', 'uint32' }, { 3, 'last_turns', 'uint32' },
    { 4, 'token_ids', 'bool' },
  },
  Request = {
    { 1, 'id', 'uint64' }, { 2, 'hello', 'Hello' }, { 3, 'open', 'OpenSession' },
    { 5, 'generate', 'Generate' }, { 6, 'fork', 'Fork' }, { 8, 'list', 'ListSessions' },
    { 9, 'info', 'GetInfo' }, { 13, 'cancel', 'Cancel' }, { 16, 'transcript', 'GetTranscript' },
  },
  Error = { { 1, 'code', 'enum' }, { 2, 'message', 'string' } },
  SessionInfo = {
    { 1, 'session', 'string' }, { 2, 'tokens', 'uint32' }, { 3, 'cached_tokens', 'uint32' },
    { 4, 'kv_bytes', 'uint64' }, { 5, 'kv_blocks', 'uint32' }, { 6, 'shared_blocks', 'uint32' },
    { 7, 'last_use_ms', 'int64' }, { 8, 'template', 'enum' }, { 9, 'context_policy', 'enum' },
    { 10, 'turns', 'uint32' }, { 11, 'busy', 'bool' }, { 12, 'prefilled_tokens', 'uint64' },
    { 13, 'generated_tokens', 'uint64' }, { 14, 'system', 'string' }, { 15, 'owner_uid', 'uint32' },
    { 16, 'ephemeral', 'bool' }, { 17, 'context_length', 'uint32' }, { 18, 'created', 'bool' },
    { 19, 'tokens_added', 'uint32' }, { 20, 'location', 'enum' }, { 21, 'saved', 'bool' },
    { 22, 'file_bytes', 'uint64' }, { 23, 'system_cut', 'bool' },
    { 24, 'computed_tokens', 'uint32' }, { 25, 'dropped_turns', 'uint32' },
  },
  SessionList = { { 1, 'sessions', 'SessionInfo', 'repeated' }, { 2, 'next', 'string' } },
  TokenEvent = { { 1, 'text', 'string' }, { 2, 'tokens', 'uint32', 'repeated' } },
  Done = {
    { 1, 'reason', 'enum' }, { 2, 'prompt_tokens', 'uint32' }, { 3, 'generated_tokens', 'uint32' },
    { 4, 'prefill_ms', 'double' }, { 5, 'generate_ms', 'double' }, { 6, 'session_tokens', 'uint32' },
    { 7, 'stop', 'string' }, { 8, 'dropped_turns', 'uint32' }, { 9, 'dropped_tokens', 'uint32' },
    { 10, 'slid_tokens', 'uint32' }, { 11, 'shared_tokens', 'uint32' },
    { 12, 'context_tokens', 'uint32' },
  },
  Turn = {
    { 1, 'index', 'uint32' }, { 2, 'role', 'enum' }, { 3, 'text', 'string' }, { 4, 'tokens', 'uint32' },
    { 5, 'start', 'uint32' }, { 6, 'generated', 'bool' }, { 7, 'stop_reason', 'enum' },
    { 8, 'token_ids', 'uint32', 'repeated' }, { 9, 'truncated', 'bool' },
    { 10, 'slid_tokens', 'uint32' },
  },
  Transcript = {
    { 1, 'session', 'string' }, { 2, 'turns', 'uint32' }, { 3, 'first', 'uint32' },
    { 4, 'next', 'uint32' }, { 5, 'items', 'Turn', 'repeated' }, { 6, 'system', 'string' },
    { 7, 'template', 'enum' }, { 8, 'location', 'enum' }, { 9, 'busy', 'bool' },
    { 10, 'dropped_turns', 'uint32' }, { 11, 'dropped_tokens', 'uint64' },
  },
  Ok = {},
  Response = {
    { 1, 'id', 'uint64' }, { 2, 'error', 'Error' }, { 3, 'hello', 'HelloReply' },
    { 4, 'session', 'SessionInfo' }, { 5, 'sessions', 'SessionList' }, { 6, 'token', 'TokenEvent' },
    { 7, 'done', 'Done' }, { 11, 'ok', 'Ok' }, { 13, 'transcript', 'Transcript' },
  },
}

-- wire type of each scalar type; a message type is length-delimited (2)
local WIRE = {
  uint32 = 0, uint64 = 0, int32 = 0, int64 = 0, bool = 0, enum = 0,
  string = 2, bytes = 2, float = 5, double = 1,
}

-- Compiled schemas: M.schema[name] = { list = fields in number order,
-- by_num = { [number] = field } }, field = { num, name, type, wire, repeated,
-- msg (schema, for message types), packed }.
M.schema = {}
for name in pairs(defs) do M.schema[name] = { list = {}, by_num = {} } end
for name, fields in pairs(defs) do
  local s = M.schema[name]
  for _, d in ipairs(fields) do
    local f = { num = d[1], name = d[2], type = d[3], repeated = d[4] == 'repeated' }
    f.msg = M.schema[f.type]
    f.wire = f.msg and 2 or WIRE[f.type]
    assert(f.wire, 'pb: unknown type ' .. f.type)
    f.packed = f.repeated and not f.msg and f.wire ~= 2
    table.insert(s.list, f)
    s.by_num[f.num] = f
  end
  table.sort(s.list, function(a, b) return a.num < b.num end)
end

-- Enum value names, as in llamad.proto (M.enum_name(M.ErrorCode, 7) == 'TOO_LARGE').
M.ErrorCode = {
  [0] = 'ERROR_UNSPECIFIED', 'BAD_REQUEST', 'UNKNOWN_SESSION', 'SESSION_EXISTS', 'CONTEXT_FULL',
  'BUSY', 'BAD_VERSION', 'TOO_LARGE', 'CANCELLED', 'UNKNOWN_OP', 'REFUSED_TEXT', 'UNKNOWN_REQUEST',
  'PERMISSION_DENIED',
  [100] = 'RESOURCE_EXHAUSTED', [101] = 'INTERNAL', [102] = 'SHUTTING_DOWN', [103] = 'STORAGE',
}
M.StopReason = {
  [0] = 'STOP_UNSPECIFIED', 'STOP_EOS', 'STOP_MAX_TOKENS', 'STOP_STRING', 'STOP_CONTEXT_FULL',
  'STOP_CANCELLED',
}
M.Role = { [0] = 'ROLE_USER', 'ROLE_SYSTEM', 'ROLE_ASSISTANT', 'ROLE_RAW' }
M.Template = { [0] = 'TEMPLATE_DEFAULT', 'TEMPLATE_LLAMA2', 'TEMPLATE_RAW', 'TEMPLATE_LLAMA3' }
M.Location = { [0] = 'LOCATION_POOL', 'LOCATION_RAM', 'LOCATION_DISK' }

-- enum_name(enum, v): the name of value v (v nil reads as 0), or "PREFIX_<v>"
-- for a value this plugin does not know.
function M.enum_name(enum, v)
  v = v or 0
  return enum[v] or (enum[0]:match('^[A-Z]+') .. '_' .. tostring(v))
end

-- ------------------------------------------------------------------ floats --
-- round half to even (what IEEE conversion does)
local function round_even(x)
  local r = floor(x)
  local d = x - r
  if d > 0.5 or (d == 0.5 and r % 2 == 1) then r = r + 1 end
  return r
end

-- float32 bits of x (a Lua number), as an integer in [0, 2^32)
local function float_bits(x)
  if x ~= x then return 0x7FC00000 end
  local sign = (x < 0 or (x == 0 and 1 / x < 0)) and 0x80000000 or 0
  x = math.abs(x)
  if x == math.huge then return sign + 0x7F800000 end
  if x == 0 then return sign end
  local m, e = frexp(x)            -- x = m * 2^e, 0.5 <= m < 1
  local E = e + 126                -- biased exponent of 1.f * 2^(e-1)
  if E <= 0 then                   -- subnormal: x / 2^-149, may round up to the smallest normal
    return sign + round_even(ldexp(x, 149))
  end
  local f = round_even((m * 2 - 1) * 8388608)
  if f == 8388608 then f, E = 0, E + 1 end
  if E >= 255 then return sign + 0x7F800000 end
  return sign + E * 8388608 + f
end

local function float_from_bits(b)
  local sign = b >= 0x80000000 and -1 or 1
  b = b % 0x80000000
  local E, f = floor(b / 8388608), b % 8388608
  if E == 255 then return f == 0 and sign * math.huge or 0 / 0 end
  if E == 0 then return sign * ldexp(f, -149) end
  return sign * ldexp(f + 8388608, E - 150)
end

-- double: returns lo, hi 32-bit halves of the IEEE bits of x
local function double_bits(x)
  if x ~= x then return 0, 0x7FF80000 end
  local sign = (x < 0 or (x == 0 and 1 / x < 0)) and 0x80000000 or 0
  x = math.abs(x)
  if x == math.huge then return 0, sign + 0x7FF00000 end
  if x == 0 then return 0, sign end
  local m, e = frexp(x)
  local E, f = e + 1022, nil
  if E <= 0 then E, f = 0, ldexp(x, 1074)    -- subnormal: exact
  else f = ldexp(m, 53) - 4503599627370496 end  -- 52-bit fraction, exact
  return f % TWO32, sign + E * 1048576 + floor(f / TWO32)
end

local function double_from_bits(lo, hi)
  local sign = hi >= 0x80000000 and -1 or 1
  hi = hi % 0x80000000
  local E = floor(hi / 1048576)
  local f = (hi % 1048576) * TWO32 + lo
  if E == 2047 then return f == 0 and sign * math.huge or 0 / 0 end
  if E == 0 then return sign * ldexp(f, -1074) end
  return sign * ldexp(f + 4503599627370496, E - 1075)
end

local function le32(v)
  return char(v % 256, floor(v / 256) % 256, floor(v / 65536) % 256, floor(v / 16777216) % 256)
end

M.float_bits, M.float_from_bits = float_bits, float_from_bits
M.double_bits, M.double_from_bits = double_bits, double_from_bits

-- ----------------------------------------------------------------- encoder --
-- varint of the 64-bit value hi * 2^32 + lo (both in [0, 2^32))
local function varint64(out, lo, hi)
  while true do
    local b = lo % 128
    lo = floor(lo / 128) + (hi % 128) * 33554432  -- hi's low 7 bits move into lo's top
    hi = floor(hi / 128)
    if lo == 0 and hi == 0 then out[#out + 1] = char(b); return end
    out[#out + 1] = char(b + 128)
  end
end

-- varint of an integer v (negative: two's complement, 10 bytes, as protobuf
-- writes int32/int64); non-integers and values past 2^64 are an error
local function varint(out, v)
  if v >= 0 and v < 128 then out[#out + 1] = char(v); return end
  assert(v == floor(v) and v < 18446744073709551616 and v >= -9223372036854775808,
    'pb: not an integer in range: ' .. tostring(v))
  varint64(out, v % TWO32, floor(v / TWO32) % TWO32)
end

local encode_into

local function encode_value(out, f, v)
  local t = f.type
  if f.msg then
    local sub_out = {}
    encode_into(sub_out, f.msg, v)
    local s = concat(sub_out)
    varint(out, #s); out[#out + 1] = s
  elseif t == 'string' or t == 'bytes' then
    assert(type(v) == 'string', 'pb: ' .. f.name .. ' is not a string')
    varint(out, #v); out[#out + 1] = v
  elseif t == 'bool' then out[#out + 1] = v and '\1' or '\0'
  elseif t == 'float' then out[#out + 1] = le32(float_bits(v))
  elseif t == 'double' then
    local lo, hi = double_bits(v)
    out[#out + 1] = le32(lo) .. le32(hi)
  else varint(out, v) end
end

encode_into = function(out, schema, msg)
  for _, f in ipairs(schema.list) do
    local v = msg[f.name]
    if v ~= nil then
      if f.packed then
        if #v > 0 then
          local p = {}
          for _, x in ipairs(v) do encode_value(p, f, x) end
          local s = concat(p)
          varint(out, f.num * 8 + 2); varint(out, #s); out[#out + 1] = s
        end
      elseif f.repeated then
        for _, x in ipairs(v) do varint(out, f.num * 8 + f.wire); encode_value(out, f, x) end
      else
        varint(out, f.num * 8 + f.wire); encode_value(out, f, v)
      end
    end
  end
end

-- encode(name, msg): the serialized bytes of message `name` (a key of
-- M.schema) from table msg; fields not in the schema are ignored.
function M.encode(name, msg)
  local out = {}
  encode_into(out, assert(M.schema[name], 'pb: unknown message ' .. name), msg)
  return concat(out)
end

-- ----------------------------------------------------------------- decoder --
-- Errors inside the decoder are raised as tables { pb = message } and turned
-- into (nil, message) by M.decode.
local function fail(msg) error({ pb = msg }, 0) end

-- read_varint(s, i, j): lo, hi (32-bit halves), next index; bytes i..j only
local function read_varint(s, i, j)
  if i > j then fail('truncated varint') end
  local b = byte(s, i)
  if b < 128 then return b, 0, i + 1 end  -- the common case
  local lo, hi, k = b - 128, 0, 1
  while true do
    i = i + 1
    if i > j then fail('truncated varint') end
    if k >= 10 then fail('varint longer than 10 bytes') end
    b = byte(s, i)
    local p = b % 128
    if k < 4 then lo = lo + p * 2 ^ (7 * k)
    elseif k == 4 then lo = lo + (p % 16) * 268435456; hi = floor(p / 16)
    else hi = hi + p * 2 ^ (7 * k - 32) end
    k = k + 1
    if b < 128 then return lo, hi % TWO32, i + 1 end
  end
end

local function fixed32(s, i, j)
  if i + 3 > j then fail('truncated fixed32') end
  local a, b, c, d = byte(s, i, i + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end

local function scalar_varint(t, lo, hi)
  if t == 'bool' then return lo ~= 0 or hi ~= 0 end
  if t == 'uint32' then return lo end
  if (t == 'int32' or t == 'int64' or t == 'enum') and hi >= 0x80000000 then
    if t == 'int64' then return (hi - TWO32) * TWO32 + lo end
    return lo - TWO32   -- int32/enum: the low 32 bits, signed
  end
  if t == 'int32' or t == 'enum' then return lo >= 0x80000000 and lo - TWO32 or lo end
  return hi * TWO32 + lo
end

-- skip(s, i, j, wire, num): index after a field of that wire type whose tag
-- ended before i (groups: up to and including the matching end-group tag)
local function skip(s, i, j, wire, num)
  if wire == 0 then local _, _, n = read_varint(s, i, j); return n
  elseif wire == 1 then if i + 7 > j then fail('truncated fixed64') end; return i + 8
  elseif wire == 5 then if i + 3 > j then fail('truncated fixed32') end; return i + 4
  elseif wire == 2 then
    local len, hi, n = read_varint(s, i, j)
    if hi ~= 0 or n + len - 1 > j then fail('length-delimited field past the end') end
    return n + len
  elseif wire == 3 then
    while true do
      local lo, hi, n = read_varint(s, i, j)
      if hi ~= 0 then fail('bad tag') end
      local w, fn = lo % 8, floor(lo / 8)
      if w == 4 then
        if fn ~= num then fail('mismatched end of group') end
        return n
      end
      if fn == 0 then fail('field number 0') end
      i = skip(s, n, j, w, fn)
    end
  end
  fail(wire == 4 and 'end of group without a start' or ('bad wire type ' .. wire))
end

local decode_msg

local function decode_value(s, i, j, f)
  local w, t = f.wire, f.type
  if w == 0 then
    local lo, hi, n = read_varint(s, i, j)
    return scalar_varint(t, lo, hi), n
  elseif w == 2 then
    local len, hi, n = read_varint(s, i, j)
    if hi ~= 0 or n + len - 1 > j then fail('length-delimited field past the end') end
    if f.msg then return decode_msg(f.msg, s, n, n + len - 1), n + len end
    return sub(s, n, n + len - 1), n + len
  elseif w == 5 then
    local b = fixed32(s, i, j)
    return float_from_bits(b), i + 4
  else -- 1: double
    local lo = fixed32(s, i, j)
    local hi = fixed32(s, i + 4, j)
    return double_from_bits(lo, hi), i + 8
  end
end

-- decode_msg(schema, s, i, j): the message held in bytes i..j of s
decode_msg = function(schema, s, i, j)
  local msg, by_num = {}, schema.by_num
  while i <= j do
    local lo, hi, n = read_varint(s, i, j)
    if hi ~= 0 then fail('bad tag') end
    local wire, num = lo % 8, floor(lo / 8)
    if num == 0 then fail('field number 0') end
    local f = by_num[num]
    if f and f.wire == wire then
      local v
      v, i = decode_value(s, n, j, f)
      if f.repeated then
        local list = msg[f.name] or {}
        list[#list + 1] = v
        msg[f.name] = list
      elseif f.msg and msg[f.name] then
        -- a message field seen twice merges (protobuf rule); shallow is enough here
        for k, x in pairs(v) do msg[f.name][k] = x end
      else
        msg[f.name] = v
      end
    elseif f and f.packed and wire == 2 then
      local len, lhi, p = read_varint(s, n, j)
      local e = p + len - 1
      if lhi ~= 0 or e > j then fail('packed field past the end') end
      local list = msg[f.name] or {}
      while p <= e do
        local v
        v, p = decode_value(s, p, e, f)
        list[#list + 1] = v
      end
      msg[f.name] = list
      i = e + 1
    else
      i = skip(s, n, j, wire, num)  -- unknown field, or a wire type we do not expect
    end
  end
  if i ~= j + 1 then fail('field past the end of the message') end
  return msg
end

-- decode(name, s): the message `name` serialized in string s, or nil and a
-- short reason when s does not decode.
function M.decode(name, s)
  local ok, res = pcall(decode_msg, assert(M.schema[name], 'pb: unknown message ' .. name), s, 1, #s)
  if ok then return res end
  if type(res) == 'table' and res.pb then return nil, res.pb end
  error(res, 0)
end

-- The names of Response's oneof body, in field order.
local BODIES = { 'error', 'hello', 'session', 'sessions', 'token', 'done', 'ok', 'transcript' }

-- decode_response(s): a Response with .body set to the name of the body it
-- holds ('token', 'done', ...; 'unknown' for a body this plugin does not
-- know, e.g. a newer daemon's), or nil and a reason.
function M.decode_response(s)
  local r, err = M.decode('Response', s)
  if not r then return nil, err end
  r.id = r.id or 0
  r.body = 'unknown'
  for _, b in ipairs(BODIES) do
    if r[b] then r.body = b; break end
  end
  return r
end

-- ----------------------------------------------------------------- framing --
-- frame(body): body with its 4-byte big-endian length in front
function M.frame(body)
  local n = #body
  return char(floor(n / 16777216) % 256, floor(n / 65536) % 256, floor(n / 256) % 256, n % 256) .. body
end

local Reader = {}
Reader.__index = Reader

-- reader(limit): a frame assembler for a byte stream. reader:feed(chunk)
-- takes the next bytes, cut anywhere, and returns the list of frame bodies
-- now complete (possibly empty); when a header announces more than `limit`
-- bytes it returns the complete ones and an error message as a second value,
-- and the reader is then dead (the stream cannot be resynchronised).
-- reader:pending() is the number of bytes held (0 at a frame boundary).
function M.reader(limit)
  return setmetatable({ parts = {}, off = 1, have = 0, need = nil, limit = limit }, Reader)
end

-- take n bytes (n <= have) from the held parts
function Reader:take(n)
  local parts = self.parts
  local first = parts[1]
  if #first - self.off + 1 < n then  -- spans parts: join them once
    first = concat(parts, '', 1, #parts):sub(self.off)
    self.parts, parts = { first }, nil
    self.off = 1
  end
  local s = sub(first, self.off, self.off + n - 1)
  self.off = self.off + n
  self.have = self.have - n
  if self.off > #first then
    table.remove(self.parts, 1)
    self.off = 1
  end
  return s
end

function Reader:feed(chunk)
  local out = {}
  if self.dead then return out, self.dead end
  if #chunk > 0 then
    self.parts[#self.parts + 1] = chunk
    self.have = self.have + #chunk
  end
  while true do
    if not self.need then
      if self.have < 4 then return out end
      local a, b, c, d = byte(self:take(4), 1, 4)
      local n = ((a * 256 + b) * 256 + c) * 256 + d
      if n > self.limit then
        self.dead = string.format('a reply frame of %d bytes is over the limit of %d bytes', n, self.limit)
        return out, self.dead
      end
      self.need = n
    end
    if self.have < self.need then return out end
    out[#out + 1] = self.need == 0 and '' or self:take(self.need)
    self.need = nil
  end
end

function Reader:pending()
  return self.have + (self.need and 4 or 0)
end

return M
