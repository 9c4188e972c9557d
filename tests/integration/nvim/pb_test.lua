-- tests/integration/nvim/pb_test.lua — client/nvim/lua/llamad/pb.lua alone:
-- the byte-level examples of llamad-protocol(7), floats and doubles, 64-bit
-- and negative varints, unknown fields of every wire type, packed and
-- unpacked repeated fields, framing across any chunk boundaries, and random
-- bytes that must decode or fail cleanly (never raise). Prints ok/FAIL
-- lines and "pb: all ok"; exits 1 on failure. Run by nvim.sh.
local pb = require('llamad.pb')
local fails = 0
local function out(s) io.stdout:write(s, '\n') end
local function check(cond, msg, detail)
  if cond then out('ok   pb: ' .. msg) else
    fails = fails + 1
    out('FAIL: pb: ' .. msg .. (detail and (' (' .. tostring(detail) .. ')') or ''))
  end
end
local function hex(s) return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end)) end
local function unhex(h) return (h:gsub('%s', ''):gsub('..', function(x) return string.char(tonumber(x, 16)) end)) end

-- llamad-protocol(7) EXAMPLES
local hello = pb.frame(pb.encode('Request', { id = 1, hello = { protocol_version = 1 } }))
check(hex(hello) == '00000006080112020801', 'Hello frame as in the man page', hex(hello))
local gen = pb.frame(pb.encode('Request', { id = 3, generate = { session = 's', prompt = 'Once upon a time',
  max_tokens = 2, sampler = { temperature = 0 } } }))
check(hex(gen) == '00000022' .. '08032a1e' .. '0a0173' .. '12104f6e63652075706f6e20612074696d65' .. '2002'
  .. '2a050d00000000', 'Generate frame as in the man page', hex(gen))
local r = pb.decode_response(unhex('0803 3207 0a012c 1202b003'))
check(r and r.id == 3 and r.body == 'token' and r.token.text == ',' and r.token.tokens[1] == 432,
  'token event of the man page')
r = pb.decode_response(unhex('0805 121b 0802 1217') .. "no session named 'nope'")
check(r and r.body == 'error' and r.error.code == 2 and pb.enum_name(pb.ErrorCode, r.error.code) == 'UNKNOWN_SESSION'
  and r.error.message == "no session named 'nope'", 'error reply of the man page')
local cancel = pb.encode('Request', { id = 4, cancel = { session = 's' } })
local back = pb.decode('Request', cancel)
check(hex(cancel) == '08046a03120173' and back and back.cancel.session == 's',
  'Cancel by session (field 2), both ways', hex(cancel))
check(pb.enum_name(pb.ErrorCode, 102) == 'SHUTTING_DOWN' and pb.enum_name(pb.ErrorCode, 55) == 'ERROR_55',
  'enum names, known and unknown')

-- floats (fixed32) and doubles (fixed64)
local fl = { [0.8] = 0x3f4ccccd, [1] = 0x3f800000, [-2.5] = 0xc0200000, [1e-40] = 0x000116c2,
  [3.4e38] = 0x7f7fc99e, [1e39] = 0x7f800000, [0] = 0, [2 ^ -149] = 1, [1.5 * 2 ^ -149] = 2 }
local good = true
for x, bits in pairs(fl) do good = good and pb.float_bits(x) == bits end
good = good and pb.float_bits(-0.0) == 0x80000000 and pb.float_bits(0 / 0) == 0x7fc00000
  and pb.float_from_bits(0x3f4ccccd) == 0.800000011920928955078125 and pb.float_from_bits(1) == 2 ^ -149
  and pb.float_from_bits(0xff800000) == -math.huge and pb.float_from_bits(0x7fc00000) ~= pb.float_from_bits(0x7fc00000)
check(good, 'float32: normal, subnormal, rounding, overflow, signed zero, NaN')
good = true
for _, x in ipairs({ 0.8, 1, -2.5, 1e-310, 4.9e-324, 1e300, 123.456, 2 ^ 53 + 2, -0.0, math.huge }) do
  local lo, hi = pb.double_bits(x)
  local y = pb.double_from_bits(lo, hi)
  good = good and y == x and (1 / y) == (1 / x)
end
local lo, hi = pb.double_bits(0.8)
good = good and string.format('%08x%08x', hi, lo) == '3fe999999999999a'
local d = pb.decode('Done', unhex('21 9a99999999 99e93f'))
check(good and d and d.prefill_ms == 0.8, 'double: bits and round trips')

-- varints
local s = pb.decode('SamplerOptions', pb.encode('SamplerOptions', { top_k = -5, seed = 2 ^ 53, repeat_last_n = -1 }))
check(s.top_k == -5 and s.seed == 2 ^ 53 and s.repeat_last_n == -1, 'negative int32, uint64 up to 2^53')
check(hex(pb.encode('SamplerOptions', { top_k = -1 })) == '10ffffffffffffffffff01', 'negative int32: 10 bytes')
local i = pb.decode('SessionInfo', pb.encode('SessionInfo', { last_use_ms = -1234567890123, kv_bytes = 2 ^ 40 + 7 }))
check(i.last_use_ms == -1234567890123 and i.kv_bytes == 2 ^ 40 + 7, 'int64 negative, uint64 over 2^32')
local big = pb.decode('Cancel', unhex('08ffffffffffffffffff01'))
check(big and big.request_id == 2 ^ 64 - 1, '2^64-1 decodes (rounded to a double)', big and big.request_id)
local bad, err = pb.decode('Cancel', unhex('08ffffffffffffffffffff01'))
check(bad == nil and err:find('longer than 10'), 'an 11-byte varint is an error', err)

-- unknown fields of every wire type are skipped, known ones kept
local unk = unhex('43 0801 44') .. unhex('49 0102030405060708') .. unhex('55 01020304') .. unhex('60 ffff01')
  .. unhex('72 024142') .. unhex('7b 63 64 7c') .. unhex('f807 05')   -- groups (nested), fixed64, fixed32, varint, len, field 127
r = pb.decode_response(pb.encode('Response', { id = 7 }) .. unk .. pb.encode('Response',
  { token = { text = 'hi', tokens = { 1, 300 } } }))
check(r and r.id == 7 and r.body == 'token' and r.token.text == 'hi' and r.token.tokens[2] == 300,
  'unknown fields of wire types 0, 1, 2, 3/4 (nested groups), 5 skipped')
r = pb.decode_response(unhex('3a 04 5801 0801') .. unhex('08 09'))   -- Done with unknown field 11
check(r and r.body == 'done' and r.id == 9 and r.done.reason == 1, 'unknown field inside a known message')
r = pb.decode_response(unhex('0801 72 00'))
check(r and r.body == 'unknown' and r.id == 1, 'a body this plugin does not know: body "unknown"')
for _, case in ipairs({ { '0e', 'bad wire type 6' }, { '0f', 'bad wire type 7' }, { '0c', 'end of group' },
  { '0b', 'truncated' }, { '0b 14', 'mismatched' }, { '12 05 01', 'past the end' }, { '00', 'field number 0' },
  { '09 0102', 'truncated fixed64' }, { '0d 01', 'truncated fixed32' }, { '08', 'truncated varint' },
  { '32 02 0a 05', 'past the end' } }) do
  local v, e = pb.decode_response(unhex(case[1]))
  check(v == nil and e and e:find(case[2], 1, true), 'malformed ' .. case[1] .. ': ' .. case[2], e)
end

-- repeated: packed and not
local t = pb.decode('TokenEvent', unhex('1005 1006 1203 070809'))
check(t.tokens[1] == 5 and t.tokens[2] == 6 and t.tokens[5] == 9 and #t.tokens == 5, 'repeated uint32 packed and unpacked')
check(hex(pb.encode('TokenEvent', { tokens = { 1, 300 } })) == '1203' .. '01ac02', 'repeated uint32 written packed')
check(hex(pb.encode('Generate', { stop = { 'a', 'bc' } })) == '3201613202' .. '6263', 'repeated string')

-- framing: any chunking, empty frames, limits
local all, n = {}, 60
for k = 1, n do all[#all + 1] = pb.frame(pb.encode('Response', { id = k, token = { text = string.rep('x', k) } })) end
all[#all + 1] = pb.frame('')
all = table.concat(all)
good = true
for _, size in ipairs({ 1, 2, 3, 5, 7, 64, 1000, #all }) do
  local rd, seen = pb.reader(1000), 0
  for k = 1, #all, size do
    local frames, e = rd:feed(all:sub(k, k + size - 1))
    good = good and not e
    for _, f in ipairs(frames) do
      seen = seen + 1
      if seen <= n then
        local m = pb.decode_response(f)
        good = good and m.id == seen and #m.token.text == seen
      else good = good and f == '' end
    end
  end
  good = good and seen == n + 1 and rd:pending() == 0
end
check(good, 'frames reassembled from chunks of 1, 2, 3, 5, 7, 64, 1000 bytes and whole')
local rd = pb.reader(100)
local frames, e = rd:feed(pb.frame('ok') .. '\0\0\0\101' .. 'more')
check(#frames == 1 and frames[1] == 'ok' and e and e:find('101 bytes is over the limit of 100'),
  'a header over the limit: the frames before, then an error', e)
frames, e = rd:feed(pb.frame('x'))
check(#frames == 0 and e, 'the reader stays dead after that')
rd = pb.reader(2 ^ 31)
frames, e = rd:feed('\255\255\255\255')
check(#frames == 0 and e and e:find('4294967295'), 'a 4 GiB header against a 2 GiB limit', e)

-- random bytes: decode or fail cleanly, never raise
math.randomseed(7)
local raised = 0
for _ = 1, 20000 do
  local len, b = math.random(0, 24), {}
  for k = 1, len do b[k] = string.char(math.random(0, 255)) end
  local okc = pcall(pb.decode_response, table.concat(b))
  if not okc then raised = raised + 1 end
end
check(raised == 0, '20000 random byte strings decode or fail cleanly', raised .. ' raised')

out(fails == 0 and 'pb: all ok' or ('pb: ' .. fails .. ' failed'))
vim.cmd(fails == 0 and 'qall!' or 'cquit! 1')
