-- llamad/conn.lua — one connection to llamad's Unix socket, asynchronous.
--
-- conn.new{ path or paths, max_reply, client, hello_timeout, on_fail,
-- on_notice } makes an unconnected object; conn:ready(cb) connects (when not
-- connected: to the first of `paths` where a daemon listens, see M.new),
-- sends Hello and calls cb(conn) once the HelloReply is in (conn.hello holds
-- it: max_frame, max_text, model, ...). conn:request(op, msg, handler) sends
-- one Request and routes every Response with its id to handler(resp, t,
-- t_frame), where t is the vim.loop.hrtime() of the socket read callback
-- that brought it and t_frame the time its decoding began; a Generate's
-- handler gets its token events and then one done or error.
--
-- Nothing here blocks: libuv callbacks only queue work with vim.schedule, and
-- all state changes and handler calls run on the main loop, in order.
--
-- When the connection fails (cannot connect, the daemon closes it, a reply
-- frame over max_reply bytes, a reply that does not decode, no HelloReply
-- within hello_timeout ms), the socket is closed, every request still
-- waiting gets handler({ body = 'closed', reason = R }), callbacks waiting
-- in ready() get cb(nil, R), and then on_fail(R, records, kind, n_ready) is
-- called once, with the records ({ id, op, ctx }) of those requests and the
-- number of ready() callbacks, so that the caller says it once. The next
-- ready() connects again.

-- LuaJIT: run this module's functions in the interpreter. They handle one
-- event in microseconds either way, but compiling their traces stalls the
-- first events of every answer for hundreds of microseconds each.
if jit then jit.off(true, true) end

local uv = vim.loop
local pb = require('llamad.pb')

local M = {}
local Conn = {}
Conn.__index = Conn

-- new(opts): see above. path: the socket; or paths: the sockets to try, in
-- order, at each connect: the next one only when connecting to one fails
-- with ENOENT or ECONNREFUSED (nothing listens there); any other error ends
-- the attempt, and the failure names every path tried with its error.
-- max_reply: largest reply frame accepted (bytes); client: Hello's client
-- string; hello_timeout: ms (for the whole attempt).
function M.new(opts)
  local paths = opts.paths or { opts.path }
  return setmetatable({
    paths = paths,
    path = paths[1],    -- the socket connected to (or being tried)
    max_reply = opts.max_reply or 64 * 1024 * 1024,
    client = opts.client or 'llamad.nvim',
    hello_timeout = opts.hello_timeout or 10000,
    on_fail = opts.on_fail or function() end,
    on_notice = opts.on_notice or function() end,
    state = 'closed',   -- closed | connecting | ready
    waiting = {},       -- ready() callbacks
    handlers = {},      -- id -> { id, op, handler, stream, ctx }
    next_id = 1,
    gen = 0,            -- connection generation: stale libuv callbacks are ignored
  }, Conn)
end

-- is_ready(): connected and the Hello answered
function Conn:is_ready() return self.state == 'ready' end

-- ready(cb): call cb(self) when connected (at once when it is already), or
-- cb(nil, reason) when connecting fails (on_fail says why; cb need not).
function Conn:ready(cb)
  if self.state == 'ready' then return cb(self) end
  self.waiting[#self.waiting + 1] = cb
  if self.state == 'closed' then self:_connect() end
end

function Conn:_connect()
  self.state = 'connecting'
  self.gen = self.gen + 1
  self.next_id = 1
  self.reader = pb.reader(self.max_reply)
  self.hello = nil
  local gen = self.gen
  local function main(fn)  -- run fn on the main loop if this connection still stands
    vim.schedule(function() if self.gen == gen then fn() end end)
  end
  self.timer = uv.new_timer()
  self.timer:start(self.hello_timeout, 0, function()
    main(function()
      if self.state == 'connecting' then
        self:fail(string.format('llamad at %s did not answer the Hello within %d ms', self.path,
          self.hello_timeout))
      end
    end)
  end)
  -- dial(i): connect to self.paths[i]; tried: "PATH (error)" of those before
  local tried = {}
  local function dial(i)
    local path = self.paths[i]
    self.path = path
    if #path >= 108 then  -- sun_path: libuv would cut it and connect elsewhere
      return main(function()
        self:fail(string.format('llamad: %sthe socket path %s is too long (%d bytes; at most 107)',
          #tried > 0 and ('cannot connect to ' .. table.concat(tried, ' or ') .. '; ') or '', path, #path),
          'connect')
      end)
    end
    local pipe = uv.new_pipe(false)
    self.pipe = pipe
    pipe:connect(path, function(err)
      main(function()
        if err then
          tried[#tried + 1] = string.format('%s (%s)', path, err)
          -- nothing listens there: try the next candidate
          if i < #self.paths and (err:find('^ENOENT') or err:find('^ECONNREFUSED')) then
            pipe:close()
            return dial(i + 1)
          end
          return self:fail(string.format(
            'llamad: cannot connect to %s: is llamad running? (set the socket with '
              .. "require('llamad').setup{ socket = ... } or $LLAMAD_SOCKET)", table.concat(tried, ' or ')),
            'connect')
        end
        pipe:read_start(function(rerr, chunk)
          local t = uv.hrtime()
          main(function() self:_on_read(rerr, chunk, t) end)
        end)
        self:request('hello', { protocol_version = 1, client = self.client }, function(resp)
          if resp.body == 'hello' then
            self.hello = resp.hello
            self.state = 'ready'
            self.timer:stop()
            local w = self.waiting
            self.waiting = {}
            for _, cb in ipairs(w) do
              if self.state ~= 'ready' then break end
              self:_call(cb, self)
            end
          elseif resp.body == 'error' then
            self:fail('llamad refused the Hello: ' .. M.error_text(resp.error))
          elseif resp.body ~= 'closed' then
            self:fail('llamad answered the Hello with ' .. resp.body)
          end
        end)
      end)
    end)
  end
  dial(1)
end

-- error_text(e): "CODE_NAME: message" of an Error message
function M.error_text(e)
  return pb.enum_name(pb.ErrorCode, e.code) .. ': ' .. (e.message or '')
end

function Conn:_on_read(err, chunk, t)
  if err then return self:fail('llamad: reading the socket failed: ' .. err) end
  if not chunk then
    local held = self.reader:pending()
    return self:fail(held > 0 and 'llamad closed the connection in the middle of a reply'
      or 'llamad closed the connection', 'eof')
  end
  local bodies, ferr = self.reader:feed(chunk)
  local after = {}
  self.after = after
  for _, body in ipairs(bodies) do
    local t_frame = uv.hrtime()
    local resp, derr = pb.decode_response(body)
    if not resp then
      ferr = 'a reply does not decode (' .. derr .. ')'
      break
    end
    self:_dispatch(resp, t, t_frame)
    if self.state == 'closed' then break end
  end
  self.after = nil
  for _, fn in ipairs(after) do self:_call(fn) end
  if ferr then self:fail('llamad: ' .. ferr .. '; connection closed', 'protocol') end
end

-- after_read(fn): run fn() once when the replies of the current socket read
-- have all been handed out (at once outside of one), so that a handler can
-- do its buffer work once for a burst of replies.
function Conn:after_read(fn)
  local after = self.after
  if not after then return fn() end
  if not after[fn] then
    after[fn] = true
    after[#after + 1] = fn
  end
end

function Conn:_dispatch(resp, t, t_frame)
  local rec = self.handlers[resp.id]
  if not rec then
    -- id 0: an error the daemon cannot attribute (e.g. TOO_LARGE before it
    -- closes); other unknown ids: replies to something we stopped awaiting
    if resp.id == 0 and resp.error then self.on_notice('llamad: ' .. M.error_text(resp.error)) end
    return
  end
  if not rec.stream or resp.body == 'done' or resp.body == 'error' then
    self.handlers[resp.id] = nil
  end
  self:_call(rec.handler, resp, t, t_frame)
end

-- _call(fn, ...): fn(...), a failure of fn said as one line (a bug in a
-- handler must not stop the replies that follow)
function Conn:_call(fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then
    self.on_notice('llamad: internal error: ' .. tostring(err):gsub('\n.*', ''))
  end
end

-- check(op, msg): nil when Request{ [op] = msg } fits the daemon's
-- max_frame, else the reason it does not.
function Conn:check(op, msg)
  local limit = self.hello and self.hello.max_frame
  if not limit or limit == 0 then return nil end
  local n = #pb.encode('Request', { id = self.next_id, [op] = msg })
  if n <= limit then return nil end
  return string.format("the request is %d bytes, over the daemon's limit (max_frame = %d bytes)", n, limit)
end

-- request(op, msg, handler [, ctx]): send Request{ id, [op] = msg } and
-- return its id; op is a Request field name ('generate', 'fork', ...).
-- ctx is kept for on_fail. Returns nil and a reason when not connected, or
-- when the frame would exceed the daemon's max_frame (nothing is sent then).
function Conn:request(op, msg, handler, ctx)
  if self.state == 'closed' then return nil, 'not connected' end
  local id = self.next_id
  local body = pb.encode('Request', { id = id, [op] = msg })
  local limit = self.hello and self.hello.max_frame
  if limit and limit > 0 and #body > limit then
    return nil, string.format("the request is %d bytes, over the daemon's limit (max_frame = %d bytes)",
      #body, limit)
  end
  self.next_id = id + 1
  self.handlers[id] = { id = id, op = op, handler = handler, stream = op == 'generate', ctx = ctx }
  local gen = self.gen
  self.pipe:write(pb.frame(body), function(werr)
    if werr then
      vim.schedule(function()
        if self.gen == gen then self:fail('llamad: writing to the socket failed: ' .. werr, 'eof') end
      end)
    end
  end)
  return id
end

-- pending(): the records of requests still awaiting replies
function Conn:pending()
  local list = {}
  for _, rec in pairs(self.handlers) do list[#list + 1] = rec end
  table.sort(list, function(a, b) return a.id < b.id end)
  return list
end

-- fail(reason [, kind]): close the connection (see the top of the file).
-- kind: 'connect', 'eof', 'protocol' or nil (other), passed to on_fail.
function Conn:fail(reason, kind)
  if self.state == 'closed' then return end
  self.state = 'closed'
  self.gen = self.gen + 1
  if self.timer then self.timer:stop(); self.timer:close(); self.timer = nil end
  if self.pipe and not self.pipe:is_closing() then self.pipe:close() end
  self.pipe = nil
  local recs, waiting = self:pending(), self.waiting
  self.handlers, self.waiting = {}, {}
  local shown = {}
  for _, rec in ipairs(recs) do
    if rec.op ~= 'hello' then
      shown[#shown + 1] = rec
      self:_call(rec.handler, { body = 'closed', reason = reason, kind = kind })
    end
  end
  for _, cb in ipairs(waiting) do self:_call(cb, nil, reason) end
  self.on_fail(reason, shown, kind, #waiting)
end

-- close(): close quietly (no on_fail); waiting requests get 'closed'.
function Conn:close()
  local f = self.on_fail
  self.on_fail = function() end
  self:fail('closed by the editor', 'local')
  self.on_fail = f
end

return M
