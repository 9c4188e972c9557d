-- tests/integration/nvim/test.lua — the Neovim plugin (client/nvim) against
-- real daemons, run by tests/integration/nvim.sh in a headless Neovim that
-- loaded the plugin from its pack folder. Prints "ok ..." / "FAIL: ..."
-- lines and the latency figures; exits (cquit) 0 when all passed, else 1.
-- vim.wait is used here, in the test only: the plugin never waits.
--
-- Env (set by nvim.sh): T_DIR (scratch folder), T_SOCK (daemon A),
-- T_SMALL (daemon B: --max-text 600 --max-frame 1024), T_FAKE (folder of
-- fake_server.py's sockets), T_LLAMAD, T_LLAMACTL, T_MODEL, T_TOK (to run
-- daemon C here), T_PROJ_FILE / T_PROJ_NAME (a file in a git project and
-- the session name nvim.sh computed for it), T_PLAIN_DIR / T_PLAIN_NAME (a
-- folder without .git and its name), T_PIDS (file: pids of daemons started
-- here, for the shell's cleanup), T_LIST (daemon D: --max-frame 1024) and
-- T_LIST_NAMES (file: the names of its sessions, one a line).

local uv, api = vim.loop, vim.api
local env = function(k) return (assert(os.getenv(k), 'missing env ' .. k)) end
local T = {
  dir = env('T_DIR'), sock = env('T_SOCK'), small = env('T_SMALL'), fake = env('T_FAKE'),
  llamad = env('T_LLAMAD'), llamactl = env('T_LLAMACTL'), model = env('T_MODEL'), tok = env('T_TOK'),
  pids = env('T_PIDS'),
}

local fails = 0
local function out(s) io.stdout:write(s, '\n'); io.stdout:flush() end
local function ok(msg) out('ok   nvim: ' .. msg) end
local function bad(msg) out('FAIL: nvim: ' .. msg); fails = fails + 1 end
local function check(cond, msg, detail)
  if cond then ok(msg) else bad(msg .. (detail and (' (' .. detail .. ')') or '')) end
  return cond
end
local function wait(ms, cond) return vim.wait(ms, cond, 1) end
local function q(s) return vim.inspect(s) end

-- every message the plugin gives goes through vim.notify: record them
local msgs = {}
vim.notify = function(m, l) msgs[#msgs + 1] = { msg = m, level = l } end
local function msg_list()
  local t = {}
  for _, m in ipairs(msgs) do t[#t + 1] = m.msg end
  return table.concat(t, ' | ')
end

-- llamactl(args...): its stdout and exit status (blocking: test only)
local function llamactl(sock, ...)
  local res = vim.fn.system({ T.llamactl, '--socket', sock, ... })
  return res, vim.v.shell_error
end

-- finish(h, ms): wait for a generation to end
local function finish(h, ms)
  wait(ms or 20000, function() return h:finished() end)
  return h:finished()
end

-- transcript(session, n): the plugin's transcript of a session (nil, err on failure)
local function transcript(L, session, n)
  local got
  L.transcript(n, function(err, res) got = { err = err, res = res } end, session)
  wait(10000, function() return got ~= nil end)
  if not got then return nil, 'no answer' end
  return got.res, got.err
end

local function sessions_of(sock)
  local s = llamactl(sock, '--json', 'sessions')
  local okj, list = pcall(vim.fn.json_decode, s)
  local names = {}
  if okj and type(list) == 'table' then
    for _, x in ipairs(list) do names[x.session] = x end
  end
  return names
end

local function median(t)
  local s = vim.list_extend({}, t)
  table.sort(s)
  return s[math.max(1, math.ceil(#s / 2))] or 0
end
local function pct(t, p)
  local s = vim.list_extend({}, t)
  table.sort(s)
  return s[math.max(1, math.ceil(#s * p))] or 0
end

-- daemon C, run from here so that the test can kill it mid-stream
local function spawn_daemon(sock, exited)
  local fd = uv.fs_open(T.dir .. '/c.log', 'a', 420)
  local handle, pid = uv.spawn(T.llamad, {
    args = { '--model', T.model, '--tokenizer', T.tok, '--socket', sock, '--state-dir', 'none',
      '--log-level', 'warning' },
    stdio = { nil, nil, fd },
  }, function(code, sig) exited[#exited + 1] = { code = code, sig = sig } end)
  uv.fs_close(fd)
  if not handle then return nil end
  local f = io.open(T.pids, 'a'); f:write(pid, '\n'); f:close()
  -- up when a connection is accepted (a stale socket file refuses)
  local up = false
  wait(10000, function()
    local p = uv.new_pipe(false)
    p:connect(sock, function(err) if not err then up = true end; p:close() end)
    vim.wait(20, function() return up end, 2)
    return up
  end)
  return up and pid or nil
end

local L = require('llamad')
local P = 'Tell me a story'

local tests = {}

-- 0: loaded as a user gets it, help that matches the code ------------------
tests[#tests + 1] = function()
  local cmds = { 'LlamadSend', 'LlamadInsert', 'LlamadCancel', 'LlamadFork', 'LlamadTranscript',
    'LlamadSessions', 'LlamadSession' }
  local missing = {}
  for _, c in ipairs(cmds) do
    if vim.fn.exists(':' .. c) ~= 2 then missing[#missing + 1] = c end
    if not pcall(vim.cmd, 'help :' .. c) then missing[#missing + 1] = 'help :' .. c end
  end
  local cfg = L.config()
  for k, v in pairs(cfg) do
    if not pcall(vim.cmd, 'help llamad-' .. k) then missing[#missing + 1] = 'help llamad-' .. k end
    if k == 'keymaps' then
      for kk in pairs(v) do
        if not pcall(vim.cmd, 'help llamad-keymaps-' .. kk) then missing[#missing + 1] = 'help llamad-keymaps-' .. kk end
      end
    end
  end
  for _, f in ipairs({ 'setup', 'send', 'insert', 'cancel', 'fork', 'transcript', 'sessions', 'session',
    'current_session', 'project_session', 'default_socket', 'default_sockets', 'visual_text', 'last',
    'running' }) do
    if type(L[f]) ~= 'function' then missing[#missing + 1] = 'llamad.' .. f end
    if not pcall(vim.cmd, 'help llamad.' .. f .. '()') then missing[#missing + 1] = 'help llamad.' .. f .. '()' end
  end
  vim.cmd('helpclose')
  check(#missing == 0, 'commands, API and :help llamad (every option, command and function documented)',
    table.concat(missing, ', '))
  check(L.default_socket() == (os.getenv('LLAMAD_SOCKET') or ''),
    'default socket is $LLAMAD_SOCKET when set', L.default_socket())
  check(vim.deep_equal(L.default_sockets(), { os.getenv('LLAMAD_SOCKET') }),
    '$LLAMAD_SOCKET is the only default socket when set', q(L.default_sockets()))
end

-- 1: the streamed text equals llamactl's for the same session state --------
tests[#tests + 1] = function()
  L.setup({ socket = T.sock, temperature = 0, max_tokens = 400 })
  local _, rc = llamactl(T.sock, 'generate', '--session', 'eqbase', '--temperature', '0', '-n', '8', 'Hello there')
  llamactl(T.sock, 'fork', 'eqbase', 'eq_nv')
  llamactl(T.sock, 'fork', 'eqbase', 'eq_ctl')
  check(rc == 0, 'llamactl built the base session', 'exit ' .. rc)
  -- through the command, as a user does: the whole buffer
  vim.cmd('enew')
  api.nvim_buf_set_lines(0, 0, -1, false, { P })
  local src = api.nvim_get_current_buf()
  vim.cmd('LlamadSession eq_nv')
  vim.cmd('LlamadSend')
  local h = L.last()
  finish(h)
  local want = llamactl(T.sock, 'generate', '--session', 'eq_ctl', '--temperature', '0', '-n', '400', P)
  check(h.state == 'done' and h.events > 100, ':LlamadSend streamed an answer', h.state .. ', ' .. h.events .. ' events')
  check(h:text() .. '\n' == want, 'streamed text = llamactl generate output (same session state)',
    q(h:text():sub(1, 80)) .. ' vs ' .. q(want:sub(1, 80)))
  check(h:shown() == h:text(), 'the answer buffer holds exactly the streamed text')
  local win = vim.fn.win_findbuf(h.buf)[1]
  local endrow = api.nvim_buf_get_extmark_by_id(h.buf, api.nvim_create_namespace('llamad'), h.end_mark, {})[1]
  check(win and api.nvim_win_get_cursor(win)[1] == endrow + 1, 'the answer window followed the answer to its end',
    win and (api.nvim_win_get_cursor(win)[1] .. ' vs ' .. (endrow + 1)))
  check(api.nvim_buf_get_name(h.buf) == 'llamad://eq_nv' and #vim.fn.win_findbuf(h.buf) == 1
    and api.nvim_get_current_buf() == src, 'answer in llamad://eq_nv, shown in a window, focus kept',
    api.nvim_buf_get_name(h.buf))
  -- a range: lines 2-3 of a buffer are the user turn
  api.nvim_buf_set_lines(src, 0, -1, false, { 'not this', 'Lily went', 'to the park.', 'nor this' })
  vim.cmd('2,3LlamadSend')
  h = L.last()
  finish(h)
  local tr = transcript(L, 'eq_nv', 2)
  check(tr and tr.items[1] and tr.items[1].text == 'Lily went\nto the park.',
    ':2,3LlamadSend sends lines 2-3', tr and tr.items[1] and q(tr.items[1].text))
  api.nvim_set_current_buf(src)  -- the transcript took the focus
  -- a characterwise selection
  api.nvim_buf_set_lines(src, 0, -1, false, { 'say: héllo there', 'big dog. end' })
  vim.cmd('normal! gg0f:llvj02fg\27')
  local sel = L.visual_text()
  check(sel == 'héllo there\nbig dog', 'visual_text: a characterwise selection', q(sel))
  -- the send keymap in visual mode: the selection being made
  L.setup({ socket = T.sock, temperature = 0, max_tokens = 20, keymaps = { send = '<F7>' } })
  L.session('eq_vis')
  api.nvim_feedkeys(api.nvim_replace_termcodes('gg0f:llvj02fg<F7>', true, false, true), 'mx', false)
  h = L.last()
  finish(h)
  check(h.prompt == 'héllo there\nbig dog' and h.state == 'done' and vim.fn.mode() == 'n',
    'the send keymap sends the visual selection', q(h.prompt) .. ', ' .. h.state .. ', mode ' .. vim.fn.mode())
  api.nvim_set_current_buf(src)
  L.setup({ socket = T.sock, temperature = 0, max_tokens = 400 })
  -- :LlamadInsert writes after the cursor, one undo step
  api.nvim_buf_set_lines(src, 0, -1, false, { 'Once upon a time' })
  api.nvim_win_set_cursor(0, { 1, 15 })
  L.session('eq_ins')
  vim.cmd('LlamadInsert')
  h = L.last()
  finish(h)
  local after = table.concat(api.nvim_buf_get_lines(src, 0, -1, false), '\n')
  check(h.state == 'done' and #h:text() > 0 and after == 'Once upon a time' .. h:text(),
    ':LlamadInsert streams the answer after the cursor', q(after:sub(1, 60)))
  vim.cmd('silent undo')
  after = table.concat(api.nvim_buf_get_lines(src, 0, -1, false), '\n')
  check(after == 'Once upon a time', 'the inserted answer is one undo step', q(after:sub(1, 60)))
  L.session(nil)
end

-- 2: cancel mid-stream; the partial answer stays in the session ------------
tests[#tests + 1] = function()
  L.setup({ socket = T.sock, temperature = 0, max_tokens = 450 })
  local h, session
  for try = 1, 5 do
    session = 'cancel' .. try
    vim.cmd('enew')
    api.nvim_buf_set_lines(0, 0, -1, false, { P })
    L.session(session)
    h = L.send({ on_token = function(g) if g.events == 2 then vim.cmd('LlamadCancel') end end })
    finish(h)
    if h.state == 'cancelled' then break end
  end
  check(h.state == 'cancelled' and h.reason == 'STOP_CANCELLED' and h.events < 450,
    'cancel mid-stream ends with Done STOP_CANCELLED', h.state .. ', ' .. h.events .. ' events')
  local tr, err = transcript(L, session, 1)
  local last = tr and tr.items[#tr.items]
  check(last and last.generated and last.stop_reason == 5, 'transcript: last turn generated, stop_reason CANCELLED',
    err or (last and tostring(last.stop_reason)))
  check(last and last.text == h:text() and h:shown() == h:text() and #h:text() > 0,
    'transcript: the cancelled turn holds the text shown', last and q(last.text) .. ' vs ' .. q(h:shown()))
  -- the cancel key of the answer buffer
  session = 'cancelkey'
  L.session(session)
  for _ = 1, 5 do
    h = L.send({ text = P, on_token = function(g)
      if g.events == 2 then  -- what typing it runs
        for _, m in ipairs(api.nvim_buf_get_keymap(g.buf, 'n')) do
          if m.lhs == '<C-C>' and m.callback then m.callback() end
        end
      end
    end })
    finish(h)
    if h.state == 'cancelled' then break end
  end
  check(h.state == 'cancelled', '<C-c> in the answer buffer cancels it', h.state)
  L.session(nil)
end

-- 3: no daemon: one clear message -----------------------------------------
tests[#tests + 1] = function()
  local nope = T.dir .. '/nope.sock'
  L.setup({ socket = nope })
  msgs = {}
  vim.v.errmsg = ''
  local h = L.send({ text = P })
  finish(h, 5000)
  check(h.state == 'closed', 'no daemon: the answer ends (closed)', h.state)
  check(#msgs == 1 and msgs[1].msg:find(nope, 1, true) and msgs[1].msg:find('is llamad running?', 1, true)
    and not msgs[1].msg:find('traceback') and vim.v.errmsg == '',
    'no daemon: exactly one message naming the socket, with a hint', msg_list())
  msgs = {}
  local done = false
  L.sessions(function() done = true end)
  wait(5000, function() return done end)
  check(done and #msgs == 1, 'no daemon: :LlamadSessions says it once too', msg_list())
end

-- 4: the daemon stops mid-stream; reconnect after a restart ----------------
tests[#tests + 1] = function()
  local csock = T.dir .. '/c.sock'
  L.setup({ socket = csock, temperature = 0, max_tokens = 450 })
  for _, sig in ipairs({ 'sigterm', 'sigkill' }) do
    local h, exited
    for _ = 1, 5 do
      exited = {}
      os.remove(csock)
      local pid = spawn_daemon(csock, exited)
      if not pid then return bad('daemon C did not start: ' .. (io.open(T.dir .. '/c.log'):read('*a'))) end
      msgs = {}
      h = L.send({ text = P, session = 'kill', on_token = function(g) if g.events == 2 then uv.kill(pid, sig) end end })
      finish(h)
      wait(10000, function() return #exited > 0 end)
      if h.state ~= 'done' then break end
    end
    local m = msgs[1] and msgs[1].msg or ''
    local said = sig == 'sigterm' and m:find('SHUTTING_DOWN', 1, true)
      or m:find('llamad closed the connection during the answer', 1, true)
    check(#msgs == 1 and said and m:find('the partial text is kept', 1, true),
      sig .. ' mid-stream: one message says so', msg_list())
    check((h.state == 'error' or h.state == 'closed') and #h:text() > 0 and h:shown() == h:text(),
      sig .. ' mid-stream: the partial text stays in the buffer', h.state .. ', ' .. #h:text() .. ' bytes')
    check(#exited == 1, sig .. ': daemon C exited', vim.inspect(exited))
  end
  -- the next command reconnects to the restarted daemon
  local exited = {}
  os.remove(csock)
  local pid = spawn_daemon(csock, exited)
  msgs = {}
  local h = L.send({ text = 'Hello', session = 'again', max_tokens = 10 })
  finish(h)
  check(h.state == 'done' and #h:text() > 0 and #msgs == 0, 'after a restart the next command reconnects',
    h.state .. '; ' .. msg_list())
  if pid then uv.kill(pid, 'sigterm') end
  wait(10000, function() return #exited > 0 end)
end

-- 5: a text over max_text is refused before sending ------------------------
tests[#tests + 1] = function()
  L.setup({ socket = T.small, temperature = 0, max_tokens = 4 })
  local before = vim.fn.json_decode((llamactl(T.small, '--json', 'status'))).counters
  msgs = {}
  vim.cmd('enew')
  local lines = { string.rep('word ', 100), string.rep('more ', 40) }
  local n = #table.concat(lines, '\n')
  api.nvim_buf_set_lines(0, 0, -1, false, lines)
  L.session('toolarge')
  msgs = {}
  vim.cmd('LlamadSend')
  local h = L.last()
  finish(h, 5000)
  local after = vim.fn.json_decode((llamactl(T.small, '--json', 'status'))).counters
  check(h.state == 'refused' and #msgs == 1 and msgs[1].msg:find('max_text = 600 bytes', 1, true)
    and msgs[1].msg:find(n .. ' bytes', 1, true),
    'a ' .. n .. '-byte buffer over max_text is refused, the limit named', h.state .. '; ' .. msg_list())
  check(not sessions_of(T.small).toolarge and after.errors == before.errors,
    'nothing was sent (no session, no daemon error)', vim.inspect(after))
  msgs = {}
  h = L.send({ text = ' \n ' })
  check(h.state == 'refused' and #msgs == 1 and msgs[1].msg:find('empty', 1, true), 'empty text is refused', msg_list())
  -- exactly max_text goes through
  msgs = {}
  h = L.send({ text = string.rep('abc ', 150) })
  finish(h)
  check(h.state == 'done' and #msgs == 0, 'a text of exactly max_text (600 bytes) is sent', h.state .. '; ' .. msg_list())
  L.session(nil)
end

-- 6: malformed, oversized, truncated or missing replies: an error, no hang --
tests[#tests + 1] = function()
  local want = {
    huge = 'reply frame of 4294967280 bytes is over the limit',
    garbage = 'a reply does not decode',
    trunc = 'closed the connection in the middle of a reply',
    silent = 'did not answer the Hello within 1500 ms',
    late = 'reply frame of 2147483647 bytes is over the limit',
  }
  for _, mode in ipairs({ 'huge', 'garbage', 'trunc', 'silent', 'late' }) do
    L.setup({ socket = T.fake .. '/' .. mode .. '.sock', hello_timeout = 1500 })
    msgs = {}
    local t0 = uv.hrtime()
    local h = L.send({ text = P, session = 'fake' })
    finish(h, 8000)
    local ms = (uv.hrtime() - t0) / 1e6
    check(h:finished() and h.state == 'closed' and #msgs == 1 and msgs[1].msg:find(want[mode], 1, true),
      string.format('fake daemon "%s": one error, no hang (%.0f ms)', mode, ms), h.state .. '; ' .. msg_list())
  end
end

-- 7: fork, sessions, transcript paging, the per-project default name ---------
tests[#tests + 1] = function()
  L.setup({ socket = T.sock, temperature = 0, max_tokens = 6 })
  L.session('forkbase')
  local h = L.send({ text = 'Hello there' })
  finish(h)
  local forked
  vim.cmd('LlamadFork forked')
  wait(5000, function() return L.current_session() == 'forked' end)
  check(L.current_session() == 'forked', ':LlamadFork forked continues in the fork', L.current_session())
  h = L.send({ text = 'And then?' })
  finish(h)
  local a, b = transcript(L, 'forkbase', 0), transcript(L, 'forked', 0)
  check(a and b and a.turns == 2 and b.turns == 4 and b.items[2].text == a.items[2].text,
    'the fork holds the base history, and its own turns', a and b and (a.turns .. ' / ' .. b.turns))
  local list
  L.sessions(function(err, res) list = res end)
  wait(5000, function() return list ~= nil end)
  local names = {}
  for _, s in ipairs(list or {}) do names[s.session] = true end
  local shown = table.concat(api.nvim_buf_get_lines(0, 0, -1, false), '\n')
  check(names.forkbase and names.forked and shown:find('\n%* forked ') and shown:find('\n  forkbase '),
    ':LlamadSessions lists the sessions, the current one marked', shown:sub(1, 200))
  vim.cmd('LlamadSession forkbase')
  check(L.current_session() == 'forkbase', ':LlamadSession NAME switches', L.current_session())
  forked = true

  -- paging: a daemon whose frames hold 1024 bytes
  L.setup({ socket = T.small, temperature = 0, max_tokens = 8 })
  local prompts = {}
  for i = 1, 8 do
    prompts[i] = string.format('Once upon a time there was a little girl named Lily number %d. She loved to play in the park.', i)
    h = L.send({ text = prompts[i], session = 'pages' })
    finish(h)
    if h.state ~= 'done' then return bad('paging: turn ' .. i .. ' ' .. h.state .. '; ' .. msg_list()) end
  end
  local tr = transcript(L, 'pages', 0)
  local good = tr and #tr.items == 16 and tr.turns == 16
  for i = 1, 8 do
    good = good and tr.items[2 * i - 1].index == 2 * i - 2 and tr.items[2 * i - 1].text == prompts[i]
      and tr.items[2 * i].generated
  end
  check(good and tr.pages >= 2, 'transcript of 16 turns over several 1024-byte frames, paged with next',
    tr and (#tr.items .. ' items, ' .. tr.pages .. ' pages'))
  local buf = table.concat(api.nvim_buf_get_lines(0, 0, -1, false), '\n')
  check(api.nvim_buf_get_name(0) == 'llamad://pages/transcript' and buf:find(prompts[8], 1, true)
    and buf:find('## user, turn 0', 1, true), 'transcript shown in llamad://pages/transcript', buf:sub(1, 80))
  tr = transcript(L, 'pages', 3)
  check(tr and #tr.items == 3 and tr.first == 13 and tr.items[3].index == 15, 'transcript: the last 3 turns',
    tr and (#tr.items .. ' from ' .. tr.first))
  vim.cmd('LlamadSession pages')
  vim.cmd('LlamadTranscript 2')
  local head = 'turns 14 to 15 of 16'
  wait(5000, function() return (api.nvim_buf_get_lines(0, 0, 1, false)[1] or ''):find(head, 1, true) end)
  check(api.nvim_buf_get_name(0) == 'llamad://pages/transcript'
    and api.nvim_buf_get_lines(0, 0, 1, false)[1]:find(head, 1, true), ':LlamadTranscript 2 (current session)',
    api.nvim_buf_get_lines(0, 0, 1, false)[1])

  -- the per-project default session name, as nvim.sh computed it
  L.setup({ socket = T.sock })
  local here = L.current_session()  -- 'pages', chosen for this project (the current directory's)
  vim.cmd('edit ' .. vim.fn.fnameescape(env('T_PROJ_FILE')))
  check(L.current_session() == env('T_PROJ_NAME'), 'project session: <base>-<sha256 of the project folder>',
    L.current_session() .. ' vs ' .. env('T_PROJ_NAME'))
  check(here == 'pages', 'a session chosen in one project leaves the others alone', here)
  vim.cmd('enew')
  vim.cmd('cd ' .. vim.fn.fnameescape(env('T_PLAIN_DIR')))
  check(L.current_session() == env('T_PLAIN_NAME'), 'project session without .git: the current directory',
    L.current_session() .. ' vs ' .. env('T_PLAIN_NAME'))
  vim.cmd('cd -')
  return forked
end

-- 7b: the session list in pages (ListSessions.after = SessionList.next) ----
tests[#tests + 1] = function()
  -- listing(sock): L.sessions against sock: { err, res, pages (ListSessions
  -- sent), ms }; the messages said are in msgs
  local function listing(sock)
    L.setup({ socket = sock })
    local c = L.connection()
    local pages = 0
    c.request = function(self, op, ...)
      if op == 'list' then pages = pages + 1 end
      return getmetatable(self).__index.request(self, op, ...)
    end
    msgs = {}
    local got
    local t0 = uv.hrtime()
    L.sessions(function(err, res) got = { err = err, res = res } end)
    wait(60000, function() return got ~= nil end)
    got = got or { err = 'no answer' }
    got.pages, got.ms = pages, (uv.hrtime() - t0) / 1e6
    c.request = nil
    return got
  end
  local function names_of(list)
    local t = {}
    for _, s in ipairs(list or {}) do t[#t + 1] = s.session end
    return t
  end

  -- a real daemon (max_frame 1024) holding the sessions listed in
  -- T_LIST_NAMES: each of them listed, once, in name order, nothing else
  local want = {}
  for line in io.lines(env('T_LIST_NAMES')) do want[#want + 1] = line end
  table.sort(want)
  local got = listing(env('T_LIST'))
  local names = names_of(got.res)
  check(not got.err and #msgs == 0 and vim.deep_equal(names, want),
    string.format('%d sessions of 40-byte names listed, each once, by name', #want),
    string.format('%s; %d listed, first %s, last %s; %s', tostring(got.err), #names, q(names[1]),
      q(names[#names]), msg_list()))
  check(got.pages >= 3, 'the list came in pages of at most 1024 bytes (ListSessions after = next)',
    got.pages .. ' ListSessions sent')
  out(string.format('sessions: %d listed in %d pages, %.0f ms', #names, got.pages, got.ms))
  local buf = api.nvim_buf_get_lines(0, 0, -1, false)
  local seen, dup = {}, {}
  for _, line in ipairs(buf) do
    local n = line:match('^[ *] (%S+)')
    if n and n ~= 'session' then
      if seen[n] then dup[#dup + 1] = n end
      seen[n] = true
    end
  end
  local missing = {}
  for _, n in ipairs(want) do if not seen[n] then missing[#missing + 1] = n end end
  check(api.nvim_buf_get_name(0) == 'llamad://sessions' and #missing == 0 and #dup == 0
    and #buf == #want + 1, 'llamad://sessions shows every one of them once',
    string.format('%d lines; %d missing (first %s); %d twice (first %s)', #buf, #missing, q(missing[1]),
      #dup, q(dup[1])))

  -- fake daemons: opaque cursors echoed as they came; the loop is bounded
  got = listing(T.fake .. '/pages.sock')
  check(not got.err and #msgs == 0 and got.pages == 3
    and vim.deep_equal(names_of(got.res), { 'page1-a', 'page1-b', 'page2-a', 'page3-a' }),
    'fake daemon "pages": 3 pages followed, opaque cursors sent back unchanged',
    string.format('%s; %d pages; %s; %s', tostring(got.err), got.pages, q(names_of(got.res)), msg_list()))
  local first = got.res and got.res[1] or {}
  check(first.system_cut == true and first.system == string.rep('s', 256),
    'SessionInfo.system_cut decoded', q(first.system_cut))
  got = listing(T.fake .. '/endless.sock')
  check(got.err and got.pages == 1000 and #msgs == 1
    and msgs[1].msg:find('past 1000 pages (1000 sessions)', 1, true),
    string.format('fake daemon "endless": the plugin stops after 1000 pages (%.0f ms), one message', got.ms),
    string.format('%d pages; %s', got.pages, msg_list()))
  got = listing(T.fake .. '/stuck.sock')
  check(got.err and got.pages == 2 and #msgs == 1 and msgs[1].msg:find('did not advance', 1, true),
    'fake daemon "stuck": a cursor sent back unchanged stops the listing, one message',
    string.format('%d pages; %s', got.pages, msg_list()))
end

-- 8: responsiveness and latency -------------------------------------------
tests[#tests + 1] = function()
  L.setup({ socket = T.sock, temperature = 0, max_tokens = 400 })
  llamactl(T.sock, 'generate', '--session', 'latbase', '--temperature', '0', '-n', '8', 'Hello there')
  local runs = 7
  for i = 1, runs do
    llamactl(T.sock, 'fork', 'latbase', 'lat_nv' .. i)
    llamactl(T.sock, 'fork', 'latbase', 'lat_ctl' .. i)
  end
  -- a 2 ms timer runs throughout; gaps are counted while an answer streams
  local streaming, last, gap, fired, stream_ns = false, nil, 0, 0, 0
  local timer = uv.new_timer()
  timer:start(2, 2, function()
    local now = uv.hrtime()
    if streaming and last then gap = math.max(gap, now - last); fired = fired + 1 end
    last = now
  end)
  local lat, cost, t_nv, t_ctl, events, same = {}, {}, {}, {}, 0, true
  local preempted = 0  -- involuntary context switches of this process while streaming
  for i = 1, runs do
    local t0, t1 = uv.hrtime(), nil
    last, streaming = uv.hrtime(), true
    local ru = uv.getrusage()
    local h = L.send({ text = P, session = 'lat_nv' .. i, on_done = function() t1 = uv.hrtime() end })
    finish(h)
    streaming = false
    preempted = preempted + uv.getrusage().nivcsw - ru.nivcsw
    stream_ns = stream_ns + (t1 or uv.hrtime()) - t0
    local c0 = uv.hrtime()
    local want = llamactl(T.sock, 'generate', '--session', 'lat_ctl' .. i, '--temperature', '0', '-n', '400', P)
    local c1 = uv.hrtime()
    same = same and h.state == 'done' and h:text() .. '\n' == want
    if i > 2 then  -- the first runs warm up
      t_nv[#t_nv + 1], t_ctl[#t_ctl + 1] = (t1 - t0) / 1e6, (c1 - c0) / 1e6
      vim.list_extend(lat, h.lat)
      vim.list_extend(cost, h.cost)
      events = h.events
    end
  end
  timer:stop(); timer:close()
  check(same, 'latency runs: each plugin answer = llamactl\'s')
  local us = function(ns) return ns / 1e3 end
  out(string.format('latency (a): plugin per token event, socket read callback -> text in the buffer: '
    .. 'median %.1f us, p99 %.1f us, max %.1f us over %d events', us(median(lat)), us(pct(lat, 0.99)),
    us(pct(lat, 1)), #lat))
  out(string.format('latency (a\'): plugin work per token event (decoding a read\'s frames -> their text in the buffer, / events): '
    .. 'median %.1f us, p99 %.1f us, max %.1f us', us(median(cost)), us(pct(cost, 0.99)), us(pct(cost, 1))))
  local nv, ctl = median(t_nv), median(t_ctl)
  out(string.format('latency (b): %d-event greedy answer end to end, same session state: plugin median %.2f ms, '
    .. 'llamactl median %.2f ms (its process start included): (plugin - llamactl) / events = %.4f ms per event',
    events, nv, ctl, (nv - ctl) / math.max(events, 1)))
  out(string.format('responsiveness: a 2 ms timer fired %d times during %.0f ms of streaming; longest gap %.2f ms '
    .. '(Neovim was preempted %d times meanwhile; %d CPUs)', fired, stream_ns / 1e6, gap / 1e6, preempted,
    #(uv.cpu_info() or {})))
  check(#lat > 0 and events > 0, 'latency figures measured')
  -- a blocked main loop would stop the timer: demand that it ran, loosely
  check(fired >= 10 and gap < 500e6, 'the editor stays responsive while streaming (timer kept firing)',
    fired .. ' firings, gap ' .. gap / 1e6 .. ' ms')
end

local ok_all, err = xpcall(function()
  for i, t in ipairs(tests) do
    vim.cmd('silent! only')
    local fine, e = xpcall(t, debug.traceback)
    if not fine then bad('test ' .. (i - 1) .. ' raised: ' .. tostring(e)) end
  end
end, debug.traceback)
if not ok_all then bad('raised: ' .. tostring(err)) end
out(fails == 0 and 'test.lua: all ok' or ('test.lua: ' .. fails .. ' failed'))
vim.cmd((fails == 0 and 'qall!' or 'cquit! 1'))
