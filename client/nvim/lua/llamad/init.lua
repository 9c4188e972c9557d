-- llamad/init.lua — the Neovim side of llamad: send text as a user turn of a
-- named session and stream the answer into a buffer, cancel, fork, list
-- sessions, show a session's transcript. See :help llamad.
--
-- Public API (require('llamad')): setup, send, insert, cancel, fork,
-- transcript, sessions, session, current_session, project_session,
-- default_socket, default_sockets, connection. Every call returns at once;
-- work with the daemon happens on the main loop as replies come
-- (llamad.conn). Functions taking a callback call it as cb(err, result)
-- when done (err nil on success); they also show their result in the
-- editor.

-- LuaJIT: run this module's functions in the interpreter. They handle one
-- event in microseconds either way, but compiling their traces stalls the
-- first events of every answer for hundreds of microseconds each.
if jit then jit.off(true, true) end

local pb = require('llamad.pb')
local conn = require('llamad.conn')

local api, uv = vim.api, vim.loop
local M = { version = '0.1.0' }

local defaults = {
  socket = nil,            -- nil: M.default_sockets(), tried in turn
  session = nil,           -- nil: one session per project (M.project_session)
  max_tokens = nil,        -- nil: the daemon's max_tokens
  temperature = nil,       -- nil: the daemon's temperature; 0: greedy
  stop = nil,              -- list of stop strings (at most 16)
  system = nil,            -- system prompt of sessions this plugin creates
  keymaps = {
    cancel = '<C-c>',      -- in answer buffers (normal mode): cancel the running answer
    send = false,          -- e.g. '<leader>ls': normal: whole buffer; visual: the selection
    insert = false,        -- e.g. '<leader>li': same, answer written at the cursor
    transcript = false,    -- e.g. '<leader>lt'
  },
  split = 'botright split', -- command opening a window for an answer buffer; false: none
  echo_prompt = true,      -- answer buffers show the text sent before each answer
  transcript_turns = 20,   -- :LlamadTranscript without a count: the last N turns (0: all)
  max_reply = 64 * 1024 * 1024, -- largest reply frame accepted, bytes
  hello_timeout = 10000,   -- ms to wait for the daemon's HelloReply
}

local config = vim.deepcopy(defaults)
local st = {
  conn = nil,      -- llamad.conn object of config.socket (or of the default sockets)
  chosen = {},     -- project folder -> session chosen with M.session / M.fork
  gens = {},       -- running generations (handles), oldest first
  last = nil,      -- the latest generation started
  bufs = {},       -- session -> answer buffer
  known = {},      -- session names seen in the last list (completion)
}
local ns = api.nvim_create_namespace('llamad')

-- say(msg, level): one message to the user (vim.notify, looked up at call
-- time so that tests and users may replace it).
local function say(msg, level)
  vim.notify(msg, level or vim.log.levels.INFO)
end
local ERROR, WARN = vim.log.levels.ERROR, vim.log.levels.WARN

-- ------------------------------------------------------------------ setup --
-- setup(opts): merge opts into the configuration (see `defaults` above and
-- :help llamad-options) and install the global keymaps asked for.
function M.setup(opts)
  config = vim.tbl_deep_extend('force', vim.deepcopy(defaults), opts or {})
  local k = config.keymaps or {}
  local function map(modes, lhs, fn, desc)
    if lhs and lhs ~= '' then vim.keymap.set(modes, lhs, fn, { desc = desc, silent = true }) end
  end
  -- in visual mode: take the selection, then leave visual mode
  local function selection()
    local text, last = M.visual_text()
    api.nvim_feedkeys(api.nvim_replace_termcodes('<Esc>', true, false, true), 'nx', false)
    return text, last
  end
  map('n', k.send, function() M.send() end, 'llamad: send the buffer')
  map('x', k.send, function() M.send({ text = (selection()) }) end, 'llamad: send the selection')
  map('n', k.insert, function() M.insert() end, 'llamad: answer at the cursor')
  map('x', k.insert, function()
    local text, last = selection()
    M.insert({ text = text, after_line = last })
  end, 'llamad: answer the selection below it')
  map('n', k.transcript, function() M.transcript() end, 'llamad: show the transcript')
  return M
end

-- config(): the configuration in effect (a copy)
function M.config() return vim.deepcopy(config) end

-- default_sockets(): the sockets tried, in order, when the `socket` option
-- is not set, as llamactl tries them: $LLAMAD_SOCKET alone if set and not
-- empty; else the user's $XDG_RUNTIME_DIR/llamad/llamad.sock (when not root
-- and XDG_RUNTIME_DIR is set) and then the system service's
-- /run/llamad/llamad.sock. A connect goes on to the next one only when
-- nothing listens at one (ENOENT, ECONNREFUSED; see llamad.conn).
function M.default_sockets()
  local env = os.getenv('LLAMAD_SOCKET')
  if env and env ~= '' then return { env } end
  local list = {}
  local xdg = os.getenv('XDG_RUNTIME_DIR')
  if uv.getuid() ~= 0 and xdg and xdg ~= '' then list[1] = xdg .. '/llamad/llamad.sock' end
  list[#list + 1] = '/run/llamad/llamad.sock'
  return list
end

-- default_socket(): the first of default_sockets()
function M.default_socket() return M.default_sockets()[1] end

-- ------------------------------------------------------------- connection --
-- on_fail: the connection failed (llamad.conn); say so once.
local function on_fail(reason, recs, kind, n_ready)
  local answering, partial = false, false
  for _, rec in ipairs(recs) do
    if rec.op == 'generate' then
      answering = true
      if rec.ctx and #rec.ctx.parts > 0 then partial = true end
    end
  end
  if #recs == 0 and n_ready == 0 and kind == 'eof' then return end  -- idle: reconnect later, quietly
  local msg = reason
  if answering and kind == 'eof' then
    msg = reason .. ' during the answer' .. (partial and '; the partial text is kept' or '')
  elseif partial then
    msg = reason .. '; the partial text is kept'
  end
  say(msg, ERROR)
end

-- connection(): the llamad.conn object of the configured socket, or of the
-- default sockets, tried in turn at each connect (created, not connected,
-- on first use; replaced when the socket option or the defaults change).
function M.connection()
  local paths = config.socket and { config.socket } or M.default_sockets()
  local key = table.concat(paths, '\0')
  if st.conn and st.conn.key ~= key then
    st.conn:close()
    st.conn = nil
  end
  if not st.conn then
    st.conn = conn.new({
      paths = paths, client = 'llamad.nvim ' .. M.version, on_fail = on_fail,
      on_notice = function(msg) say(msg, ERROR) end,
    })
    st.conn.key = key
  end
  -- taken at the next connect
  st.conn.max_reply, st.conn.hello_timeout = config.max_reply, config.hello_timeout
  return st.conn
end

local function error_text(e) return 'llamad: ' .. conn.error_text(e) end

-- --------------------------------------------------------------- sessions --
local function valid_session(name)
  return type(name) == 'string' and #name >= 1 and #name <= 128 and not name:find('[^A-Za-z0-9._:-]')
end

-- project_dir([path]): the project folder of `path` (a file or folder;
-- nil: the current buffer's file, or the current directory for a buffer
-- without one): the nearest folder at or above the file's folder (or the
-- folder) that holds a .git entry (folder or file), else that folder itself;
-- an absolute path without a trailing slash, symbolic links not resolved
-- (as Emacs's expand-file-name).
function M.project_dir(path)
  local start
  if path then
    local s = uv.fs_stat(path)
    start = (s and s.type == 'directory') and path or vim.fn.fnamemodify(path, ':h')
  else
    local name = api.nvim_buf_get_name(0)
    if name ~= '' and not name:find('^%a[%w+.-]*://') and vim.bo.buftype == '' then
      start = vim.fn.fnamemodify(name, ':h')
    else
      start = uv.cwd()
    end
  end
  start = vim.fn.fnamemodify(start, ':p'):gsub('(.)/$', '%1')
  local dir = start
  while true do
    if uv.fs_stat(dir .. (dir == '/' and '' or '/') .. '.git') then return dir end
    local parent = dir:match('^(.*)/[^/]*$')
    if not parent or dir == '/' then return start end
    dir = parent == '' and '/' or parent
  end
end

-- project_session([path]): the default session of the project of `path`
-- (M.project_dir): "<base>-<hash>", base the project folder's name with
-- every byte outside [A-Za-z0-9._-] removed, cut to 40 bytes ("project" if
-- nothing is left), hash the first 8 hex digits of the SHA-256 of the
-- folder's path. The Emacs package computes the same name, so both editors
-- share a project's session.
function M.project_session(path)
  local dir = M.project_dir(path)
  local base = (dir:match('([^/]*)$') or ''):gsub('[^A-Za-z0-9._-]', ''):sub(1, 40)
  if base == '' then base = 'project' end
  return base .. '-' .. vim.fn.sha256(dir):sub(1, 8)
end

-- current_session(): the session commands use: the one chosen for the
-- current project (M.project_dir) with :LlamadSession or :LlamadFork, else
-- setup's `session`, else the project's default (M.project_session).
function M.current_session()
  return st.chosen[M.project_dir()] or config.session or M.project_session()
end

-- session(name): make `name` the current project's session (nil: back to
-- the default). Nothing is sent: a session is created by its first answer.
function M.session(name)
  if name ~= nil and not valid_session(name) then
    say('llamad: bad session name ' .. vim.inspect(name) .. ': 1 to 128 of A-Z a-z 0-9 . _ : -', ERROR)
    return nil
  end
  st.chosen[M.project_dir()] = name
  say('llamad: session ' .. M.current_session())
  return M.current_session()
end

-- ----------------------------------------------------------------- buffers --
-- show(buf, focus): open a window (config.split) for buf if none shows it;
-- focus: stay in it, else go back to the window we came from. When no
-- window can be opened (E36: not enough room), say so; the buffer still
-- gets its text.
local function show(buf, focus)
  local wins = vim.fn.win_findbuf(buf)
  if #wins > 0 then
    if focus then api.nvim_set_current_win(wins[1]) end
    return
  end
  if not config.split then return end
  local from = api.nvim_get_current_win()
  local opened, err = pcall(vim.cmd, config.split)
  if not opened then
    say(string.format('llamad: cannot open a window for %s (%s)', api.nvim_buf_get_name(buf),
      tostring(err):gsub('^Vim[^:]*:', '')), WARN)
    return
  end
  api.nvim_win_set_buf(0, buf)
  if not focus then api.nvim_set_current_win(from) end
end

-- scratch(name, session): a listed nofile buffer called name, made once
local function scratch(name, session)
  for _, b in ipairs(api.nvim_list_bufs()) do
    if api.nvim_buf_get_name(b) == name then return b end
  end
  local buf = api.nvim_create_buf(true, true)
  api.nvim_buf_set_name(buf, name)
  api.nvim_buf_set_option(buf, 'bufhidden', 'hide')
  api.nvim_buf_set_option(buf, 'undolevels', -1)
  api.nvim_buf_set_option(buf, 'filetype', 'markdown')
  api.nvim_buf_set_var(buf, 'llamad_session', session)
  return buf
end

-- answer_buffer(session): the scratch buffer llamad://SESSION
local function answer_buffer(session)
  local buf = st.bufs[session]
  if buf and api.nvim_buf_is_valid(buf) then return buf end
  buf = scratch('llamad://' .. session, session)
  st.bufs[session] = buf
  local key = config.keymaps and config.keymaps.cancel
  if key and key ~= '' then
    vim.keymap.set('n', key, function() M.cancel(buf) end, { buffer = buf, desc = 'llamad: cancel the answer' })
  end
  return buf
end

-- append_lines(buf, lines): add lines at the end of buf (its first line
-- when buf is empty); returns the 0-based row of the last one
local function append_lines(buf, lines)
  local n = api.nvim_buf_line_count(buf)
  if n == 1 and api.nvim_buf_get_lines(buf, 0, 1, false)[1] == '' then
    api.nvim_buf_set_lines(buf, 0, 1, false, lines)
  else
    api.nvim_buf_set_lines(buf, n, n, false, lines)
  end
  return api.nvim_buf_line_count(buf) - 1
end

local function split_lines(text)
  if not text:find('\n', 1, true) then return { text } end
  return vim.split(text, '\n', { plain = true })
end

-- text of buf between two (row, col) positions, end exclusive
local function buf_text(buf, r1, c1, r2, c2)
  return table.concat(api.nvim_buf_get_text(buf, r1, c1, r2, c2, {}), '\n')
end

-- visual_text(): the text of the visual selection of the current buffer
-- (the one being made in visual mode, else the last one) and the 1-based
-- number of its last line; characterwise or linewise, a block taken as its
-- lines.
function M.visual_text()
  local mode, s, e = vim.fn.mode(), nil, nil
  if mode == 'v' or mode == 'V' or mode == '\22' then
    s, e = vim.fn.getpos('v'), vim.fn.getpos('.')
  else
    mode, s, e = vim.fn.visualmode(), vim.fn.getpos("'<"), vim.fn.getpos("'>")
  end
  local r1, c1, r2, c2 = s[2] - 1, s[3] - 1, e[2] - 1, e[3]
  if r2 < r1 or (r1 == r2 and c2 <= c1) then r1, c1, r2, c2 = e[2] - 1, e[3] - 1, s[2] - 1, s[3] end
  if mode ~= 'v' then
    return table.concat(api.nvim_buf_get_lines(0, r1, r2 + 1, false), '\n'), r2 + 1
  end
  local last = api.nvim_buf_get_lines(0, r2, r2 + 1, false)[1] or ''
  if c2 > #last then c2 = #last
  else  -- include every byte of the last character
    local ch = last:match('^[%z\1-\127\194-\244][\128-\191]*', c2)
    c2 = c2 - 1 + (ch and #ch or 1)
  end
  return buf_text(0, r1, math.min(c1, #(api.nvim_buf_get_lines(0, r1, r1 + 1, false)[1] or '')), r2, c2), r2 + 1
end

-- ------------------------------------------------------------ generations --
local Handle = {}
Handle.__index = Handle

-- A generation (what send and insert return):
--   session, buf, state ('connecting' | 'running' | 'done' | 'cancelled' |
--   'error' | 'closed' | 'refused'), id (the Generate's request id),
--   reason (StopReason name, when done), done (the Done message), error
--   (the Error message), events (token events seen), lat (per token event:
--   ns from the socket read callback to the text being in the buffer),
--   cost (per token event: the plugin's time from decoding the frames of
--   a socket read to their text being in the buffer, divided among them).
--   h:text(): the answer so far; h:shown(): the buffer's text between the
--   answer's marks; h:cancel(); h:finished().
function Handle:text() return table.concat(self.parts) end
function Handle:finished()
  return self.state ~= 'connecting' and self.state ~= 'running'
end
function Handle:shown()
  if not (self.buf and api.nvim_buf_is_valid(self.buf) and self.start_mark) then return nil end
  local a = api.nvim_buf_get_extmark_by_id(self.buf, ns, self.start_mark, {})
  local b = api.nvim_buf_get_extmark_by_id(self.buf, ns, self.end_mark, {})
  if not a[1] or not b[1] then return nil end
  return buf_text(self.buf, a[1], a[2], b[1], b[2])
end

-- cancel(): ask the daemon to stop this answer (Cancel with its id). The
-- answer then ends with Done STOP_CANCELLED; its text stays in the session.
function Handle:cancel()
  if self.state == 'connecting' then self.cancel_asked = true; return true end
  if self.state ~= 'running' or not self.conn:is_ready() then return false end
  if self.cancel_sent then return true end
  self.cancel_sent = true
  self.conn:request('cancel', { request_id = self.id }, function(resp)
    -- UNKNOWN_REQUEST: it ended on its own meanwhile, nothing to say
    if resp.body == 'error' and resp.error.code ~= 11 then say(error_text(resp.error), ERROR) end
  end)
  return true
end

-- write(h, text): text at the end of the answer (its end mark moves after it)
local function write(h, text)
  local buf = h.buf
  if not api.nvim_buf_is_valid(buf) then return end
  local pos = api.nvim_buf_get_extmark_by_id(buf, ns, h.end_mark, {})
  if not pos[1] then return end
  local lines = split_lines(text)
  -- windows whose cursor is on the answer's last line follow its end
  local follow = {}
  for _, w in ipairs(h.follow or {}) do
    if api.nvim_win_is_valid(w) and api.nvim_win_get_buf(w) == buf
        and api.nvim_win_get_cursor(w)[1] == pos[1] + 1 then
      follow[#follow + 1] = w
    end
  end
  if h.target == 'cursor' then
    -- one undo step for the whole answer: the first piece starts a new undo
    -- block (setting 'undolevels' closes the one before), the others join
    -- it, unless the buffer changed meanwhile
    local join = h.tick == api.nvim_buf_get_changedtick(buf)
    api.nvim_buf_call(buf, function()
      if join then pcall(vim.cmd, 'undojoin')
      elseif not h.tick then vim.cmd('let &l:undolevels = &l:undolevels') end
      api.nvim_buf_set_text(buf, pos[1], pos[2], pos[1], pos[2], lines)
    end)
  else
    api.nvim_buf_set_text(buf, pos[1], pos[2], pos[1], pos[2], lines)
  end
  h.tick = api.nvim_buf_get_changedtick(buf)
  for _, w in ipairs(follow) do pcall(api.nvim_win_set_cursor, w, { pos[1] + #lines, 0 }) end
end

-- flush(h): write the text of the token events received since the last
-- flush, and note their latencies: lat, from the socket read callback that
-- brought each event; cost, the time from decoding the first of them to the
-- text being in the buffer, shared out among them
local function flush(h)
  local n = #h.pend_t
  if n == 0 then return end
  if #h.pend > 0 then write(h, table.concat(h.pend)) end
  local now = uv.hrtime()
  local per = (now - h.pend_t0) / n
  for i = 1, n do
    if #h.lat >= 100000 then break end
    h.lat[#h.lat + 1], h.cost[#h.cost + 1] = now - h.pend_t[i], per
  end
  h.pend, h.pend_t, h.pend_t0 = {}, {}, nil
end

local REASON_NOTE = {
  STOP_MAX_TOKENS = 'max_tokens', STOP_CONTEXT_FULL = 'context full', STOP_CANCELLED = 'cancelled',
}

-- finish(h, note): the answer ended; scratch buffers get a note line
local function finish(h, note)
  for i, g in ipairs(st.gens) do if g == h then table.remove(st.gens, i); break end end
  local buf = h.buf
  if buf and h.end_mark and api.nvim_buf_is_valid(buf) then
    local pos = api.nvim_buf_get_extmark_by_id(buf, ns, h.end_mark, {})
    if pos[1] then  -- the end mark stays put from now on
      api.nvim_buf_set_extmark(buf, ns, pos[1], pos[2], { id = h.end_mark, right_gravity = false })
      if h.target == 'scratch' then
        append_lines(buf, note and { '[' .. note .. ']', '' } or { '' })
      end
    end
  end
  if h.on_done then h.on_done(h) end
end

-- begin(h, c): connected: check the size, prepare the buffer, send
-- OpenSession and Generate
local function begin(h, c)
  local max_text = c.hello.max_text
  if max_text and max_text > 0 and #h.prompt > max_text then
    h.state = 'refused'
    say(string.format("llamad: the text is %d bytes, over the daemon's limit (max_text = %d bytes); nothing was sent",
      #h.prompt, max_text), ERROR)
    return finish(h)
  end
  local sampler = h.temperature and { temperature = h.temperature } or nil
  local gen = { session = h.session, prompt = h.prompt, max_tokens = h.max_tokens, sampler = sampler, stop = h.stop }
  local too_big = c:check('generate', gen)
  if too_big then
    h.state = 'refused'
    say('llamad: ' .. too_big .. '; nothing was sent', ERROR)
    return finish(h)
  end
  if h.cancel_asked then
    h.state = 'cancelled'
    return finish(h)
  end

  -- the place the answer goes
  if h.target == 'scratch' then
    h.buf = answer_buffer(h.session)
    show(h.buf, false)
    local lines = {}
    if config.echo_prompt then
      lines = { '### you' }
      vim.list_extend(lines, split_lines(h.prompt))
      lines[#lines + 1] = ''
    end
    lines[#lines + 1] = '### llamad'
    lines[#lines + 1] = ''
    h.row, h.col = append_lines(h.buf, lines), 0
    h.follow = vim.fn.win_findbuf(h.buf)
    for _, w in ipairs(h.follow) do  -- start at the answer; write() keeps them there
      pcall(api.nvim_win_set_cursor, w, { h.row + 1, 0 })
    end
  end
  if not api.nvim_buf_is_valid(h.buf) then
    h.state = 'refused'
    say('llamad: the buffer for the answer is gone; nothing was sent', ERROR)
    return finish(h)
  end
  if h.after_line then
    api.nvim_buf_set_lines(h.buf, h.after_line, h.after_line, false, { '' })
  end
  h.start_mark = api.nvim_buf_set_extmark(h.buf, ns, h.row, h.col, { right_gravity = false })
  h.end_mark = api.nvim_buf_set_extmark(h.buf, ns, h.row, h.col, { right_gravity = true })

  c:request('open', { session = h.session, system = config.system }, function(resp)
    if resp.body == 'error' then
      h.open_failed = true
      say(error_text(resp.error), ERROR)
    end
  end)
  h.conn, h.state = c, 'running'
  h.pend, h.pend_t = {}, {}
  h.flush = function() flush(h) end
  st.gens[#st.gens + 1] = h
  h.id = c:request('generate', gen, function(resp, t, t_frame)
    local body = resp.body
    if body == 'token' then
      -- the text goes into the buffer once the frames of this socket read
      -- are all handled (flush): one buffer change for a burst of events
      local text = resp.token.text or ''
      if text ~= '' then
        h.parts[#h.parts + 1] = text
        h.pend[#h.pend + 1] = text
      end
      h.events = h.events + 1
      h.pend_t[#h.pend_t + 1] = t or uv.hrtime()
      h.pend_t0 = h.pend_t0 or t_frame or uv.hrtime()
      c:after_read(h.flush)
      if h.on_token then h.on_token(h, text) end
      return
    end
    h.flush()
    if body == 'done' then
      h.done = resp.done
      h.reason = pb.enum_name(pb.StopReason, resp.done.reason)
      h.state = h.reason == 'STOP_CANCELLED' and 'cancelled' or 'done'
      local note = REASON_NOTE[h.reason]
      if h.reason == 'STOP_CANCELLED' then
        say('llamad: answer cancelled; the partial text stays in session ' .. h.session)
      elseif h.reason == 'STOP_CONTEXT_FULL' then
        say('llamad: session ' .. h.session .. ' is full (its context length); the answer stopped there', WARN)
      end
      finish(h, note)
    elseif body == 'error' then
      h.state, h.error = 'error', resp.error
      -- after a failed OpenSession the Generate's UNKNOWN_SESSION says nothing new
      if not (h.open_failed and resp.error.code == 2) then
        say(error_text(resp.error) .. (#h.parts > 0 and '; the partial text is kept' or ''), ERROR)
      end
      finish(h, 'error: ' .. pb.enum_name(pb.ErrorCode, resp.error.code))
    elseif body == 'closed' then  -- on_fail says it
      h.state, h.close_reason = 'closed', resp.reason
      finish(h, 'connection closed')
    end
  end, h)
end

-- prompt_text(opts): opts.text, or the lines of opts.line1..line2, or the
-- whole current buffer
local function prompt_text(opts)
  if opts.text then return opts.text end
  local first, last = 0, -1
  if opts.line1 then first, last = opts.line1 - 1, opts.line2 end
  return table.concat(api.nvim_buf_get_lines(0, first, last, false), '\n')
end

-- generate(opts, target): make a handle and start it (see M.send)
local function generate(opts, target)
  opts = opts or {}
  local session = opts.session or M.current_session()
  local h = setmetatable({
    session = session, target = target, prompt = prompt_text(opts), parts = {}, events = 0, lat = {}, cost = {},
    state = 'connecting', on_token = opts.on_token, on_done = opts.on_done,
    max_tokens = opts.max_tokens or config.max_tokens,
    temperature = opts.temperature or config.temperature,
    stop = opts.stop or config.stop,
  }, Handle)
  st.last = h
  if not valid_session(session) then
    h.state = 'refused'
    say('llamad: bad session name ' .. vim.inspect(session) .. ': 1 to 128 of A-Z a-z 0-9 . _ : -', ERROR)
    finish(h)
    return h
  end
  if not h.prompt:find('%S') then
    h.state = 'refused'
    say('llamad: nothing to send: the text is empty', ERROR)
    finish(h)
    return h
  end
  if target == 'cursor' then
    h.buf = api.nvim_get_current_buf()
    if opts.after_line then  -- on a new line below that line (made by begin)
      h.after_line = math.min(opts.after_line, api.nvim_buf_line_count(h.buf))
      h.row, h.col = h.after_line, 0
    else  -- after the character under the cursor
      local cur = api.nvim_win_get_cursor(0)
      local line = api.nvim_buf_get_lines(h.buf, cur[1] - 1, cur[1], false)[1] or ''
      local ch = line:match('^[%z\1-\127\194-\244][\128-\191]*', cur[2] + 1)
      h.row, h.col = cur[1] - 1, math.min(#line, cur[2] + (ch and #ch or 0))
    end
  end
  M.connection():ready(function(c)
    if not c then
      h.state = 'closed'
      return finish(h)
    end
    begin(h, c)
  end)
  return h
end

-- send(opts): send text as a user turn of a session and stream the answer
-- into the buffer llamad://SESSION (opened in a window by config.split).
-- opts (all optional): text (default: lines line1..line2 of the current
-- buffer, or all of it), session, max_tokens, temperature, stop,
-- on_token(h, text) (after each token event), on_done(h) (at the end, also
-- after a failure). Returns the generation handle (see Handle above).
function M.send(opts) return generate(opts, 'scratch') end

-- insert(opts): like send, but the answer is written into the current
-- buffer: after the character under the cursor, or on a new line below
-- line opts.after_line (1-based; what a range or a selection gives).
function M.insert(opts) return generate(opts, 'cursor') end

-- running(): the generations still running; last(): the latest one started
function M.running() return vim.list_extend({}, st.gens) end
function M.last() return st.last end

-- cancel(buf): cancel the running answers written into buf (default: the
-- current buffer); when there are none there, every running answer.
-- Returns how many were asked to stop.
function M.cancel(buf)
  buf = buf or api.nvim_get_current_buf()
  local list = {}
  for _, h in ipairs(st.gens) do if h.buf == buf then list[#list + 1] = h end end
  if #list == 0 then list = vim.list_extend({}, st.gens) end
  local n = 0
  for _, h in ipairs(list) do if h:cancel() then n = n + 1 end end
  if n == 0 then say('llamad: no answer is running') end
  return n
end

-- ------------------------------------------------------ other operations --
-- call(op, msg, cb): one request; cb(resp) with the reply, or cb(nil, err)
-- after a daemon Error (already said) or a failed connection (said by
-- on_fail)
local function call(op, msg, cb)
  M.connection():ready(function(c, err)
    if not c then return cb(nil, err) end
    c:request(op, msg, function(resp)
      if resp.body == 'error' then
        local e = error_text(resp.error)
        say(e, ERROR)
        cb(nil, e)
      elseif resp.body == 'closed' then
        cb(nil, resp.reason)
      else
        cb(resp)
      end
    end)
  end)
end

local function done(cb, err, res)
  if cb then cb(err, res) end
end

-- fork(target, cb): fork the current session into `target` and continue in
-- it (it becomes the current project's session). cb(err, SessionInfo).
function M.fork(target, cb)
  local src, dir = M.current_session(), M.project_dir()
  if not valid_session(target) then
    say('llamad: bad session name ' .. vim.inspect(target) .. ': 1 to 128 of A-Z a-z 0-9 . _ : -', ERROR)
    return done(cb, 'bad session name')
  end
  call('fork', { session = src, target = target }, function(resp, err)
    if not resp then return done(cb, err) end
    st.chosen[dir] = target
    say(string.format('llamad: forked %s into %s; now in %s', src, target, target))
    done(cb, nil, resp.session)
  end)
end

local ROLE = { [0] = 'user', 'system', 'assistant', 'raw' }
local LOCATION = { [0] = 'pool', 'ram', 'disk' }

-- the most ListSessions pages one listing asks for: a daemon that keeps
-- answering `next` cannot keep the plugin asking forever
local MAX_LIST_PAGES = 1000

-- sessions(cb): list the daemon's sessions in the buffer llamad://sessions
-- (the current one marked *). The daemon answers a page at a time (as many
-- sessions as fit one frame, by name); while a page has `next`, the plugin
-- asks for the one after it (ListSessions.after = next), MAX_LIST_PAGES at
-- most. cb(err, list of SessionInfo sorted by name).
function M.sessions(cb)
  M.connection():ready(function(c, cerr)
    if not c then return done(cb, cerr) end
    local list, pages = {}, 0
    local function fail(e)
      say(e, ERROR)
      done(cb, e)
    end
    local function show_list()
      table.sort(list, function(a, b) return a.session < b.session end)
      st.known = {}
      local cur = M.current_session()
      local lines = { string.format('  %-40s %6s %7s  %-5s %s', 'session', 'turns', 'tokens', 'where', '') }
      for _, s in ipairs(list) do
        st.known[#st.known + 1] = s.session
        lines[#lines + 1] = string.format('%s %-40s %6d %7d  %-5s %s', s.session == cur and '*' or ' ',
          s.session, s.turns or 0, s.tokens or 0, LOCATION[s.location or 0] or '?',
          (s.busy and 'busy ' or '') .. (s.ephemeral and 'ephemeral' or ''))
      end
      if #list == 0 then lines[#lines + 1] = '  (no sessions)' end
      local buf = scratch('llamad://sessions', nil)
      api.nvim_buf_set_lines(buf, 0, -1, false, lines)
      show(buf, true)
      done(cb, nil, list)
    end
    local function page(after)
      local id, rerr = c:request('list', { after = after }, function(resp)
        if resp.body == 'error' then return fail(error_text(resp.error))
        elseif resp.body == 'closed' then return done(cb, resp.reason)  -- on_fail says it
        elseif resp.body ~= 'sessions' then
          return fail('llamad: unexpected reply to ListSessions (' .. resp.body .. ')')
        end
        pages = pages + 1
        vim.list_extend(list, resp.sessions.sessions or {})
        local nxt = resp.sessions.next
        if nxt == nil then return show_list() end
        if nxt == after then
          return fail(string.format('llamad: the session list did not advance after %d pages (%d sessions)',
            pages, #list))
        end
        if pages >= MAX_LIST_PAGES then
          return fail(string.format('llamad: the session list goes on past %d pages (%d sessions); not shown',
            MAX_LIST_PAGES, #list))
        end
        page(nxt)
      end)
      if not id then fail('llamad: ' .. rerr) end
    end
    page(nil)
  end)
end

-- known_sessions(): names seen by the last sessions() (for completion)
function M.known_sessions() return st.known end

local function stop_name(v)
  return v and pb.enum_name(pb.StopReason, v):gsub('^STOP_', ''):lower() or 'running'
end

-- transcript(n, cb, session): the last n turns (default
-- config.transcript_turns; 0: all) of a session (default: the current) in
-- the buffer llamad://SESSION/transcript. The daemon answers as many turns
-- as fit one frame; the rest is fetched from Transcript.next on. cb(err, {
-- session, turns, first, items, system, template, pages }).
function M.transcript(n, cb, session)
  n = n or config.transcript_turns
  session = session or M.current_session()
  M.connection():ready(function(c, cerr)
    if not c then return done(cb, cerr) end
    local res = { session = session, items = {}, pages = 0 }
    local function page(from, last)
      c:request('transcript', { session = session, from_turn = from, last_turns = last }, function(resp)
        if resp.body == 'error' then
          local e = error_text(resp.error)
          say(e, ERROR)
          return done(cb, e)
        elseif resp.body == 'closed' then
          return done(cb, resp.reason)
        end
        local tr = resp.transcript
        res.pages = res.pages + 1
        if res.pages == 1 then
          res.turns, res.first, res.system, res.template = tr.turns or 0, tr.first or 0, tr.system, tr.template
          res.busy = tr.busy
        end
        local items = tr.items or {}
        for _, it in ipairs(items) do
          if (it.index or 0) < res.turns then res.items[#res.items + 1] = it end
        end
        local nxt = tr.next or 0
        if nxt < res.turns and #items > 0 and nxt > (from or 0) then return page(nxt, nil) end
        if nxt < res.turns then
          local e = string.format('llamad: the transcript of %s stopped at turn %d of %d', session, nxt, res.turns)
          say(e, ERROR)
          return done(cb, e)
        end
        local lines = { string.format('# session %s: turns %d to %d of %d (%s)%s', session, res.first,
          res.turns - 1, res.turns, pb.enum_name(pb.Template, res.template):gsub('^TEMPLATE_', ''):lower(),
          res.busy and ', busy' or '') }
        if res.system and res.system ~= '' then
          lines[#lines + 1] = 'system: ' .. res.system:gsub('\n', ' ')
        end
        for _, it in ipairs(res.items) do
          lines[#lines + 1] = ''
          local head = string.format('## %s, turn %d, %d tokens', it.generated and 'answer' or
            (ROLE[it.role or 0] or '?'), it.index or 0, it.tokens or 0)
          if it.generated then head = head .. ', ' .. stop_name(it.stop_reason) end
          if it.truncated then head = head .. ', cut to fit one frame' end
          lines[#lines + 1] = head
          vim.list_extend(lines, split_lines(it.text or ''))
        end
        local buf = scratch('llamad://' .. session .. '/transcript', session)
        api.nvim_buf_set_lines(buf, 0, -1, false, lines)
        show(buf, true)
        done(cb, nil, res)
      end)
    end
    page(nil, n > 0 and n or nil)
  end)
end

-- ---------------------------------------------------------------- commands --
-- command(name, o): the user commands of plugin/llamad.lua
function M.command(name, o)
  if name == 'send' or name == 'insert' then
    local opts = {}
    if o.args ~= '' then opts.text = o.args
    elseif o.range > 0 then opts.line1, opts.line2 = o.line1, o.line2 end
    if name == 'insert' and o.range > 0 then opts.after_line = o.line2 end
    return generate(opts, name == 'send' and 'scratch' or 'cursor')
  elseif name == 'cancel' then return M.cancel()
  elseif name == 'fork' then return M.fork(o.args)
  elseif name == 'transcript' then
    local n = tonumber(o.args) or (o.count > 0 and o.count) or nil
    return M.transcript(n)
  elseif name == 'sessions' then return M.sessions()
  elseif name == 'session' then
    if o.bang then return M.session(nil) end
    if o.args == '' then return say('llamad: session ' .. M.current_session()) end
    return M.session(o.args)
  end
end

return M
