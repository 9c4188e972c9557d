-- tests/integration/nvim/fallback.lua — run by nvim.sh (through
-- tests/tools/fallback.sh) as another uid, with no socket configured (no
-- socket option, no $LLAMAD_SOCKET): lists the sessions, as
-- :LlamadSessions does, and prints one line: "result: connected PATH MODEL"
-- (the socket the plugin reached, the model its daemon's HelloReply names)
-- or "result: error MESSAGE" (what the plugin told the user).
local L = require('llamad')
local msgs = {}
vim.notify = function(m) msgs[#msgs + 1] = m end
local function out(s) io.stdout:write(s, '\n'); io.stdout:flush() end

L.setup({})
local done = false
L.sessions(function() done = true end)
vim.wait(15000, function() return done end, 5)
local c = L.connection()
if c:is_ready() and #msgs == 0 then
  out(string.format('result: connected %s %s', c.path, c.hello.model or '?'))
elseif #msgs > 0 then
  out('result: error ' .. table.concat(msgs, ' | '))
else
  out('result: no answer within 15 s')
end
vim.cmd('qall!')
