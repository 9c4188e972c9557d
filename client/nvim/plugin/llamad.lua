-- plugin/llamad.lua — the user commands of llamad (see :help llamad). The
-- Lua module is loaded on first use; nothing connects before a command runs.
if vim.g.loaded_llamad then return end
vim.g.loaded_llamad = 1
if vim.fn.has('nvim-0.7') == 0 then
  vim.api.nvim_echo({ { 'llamad: needs Neovim 0.7 or later', 'ErrorMsg' } }, true, {})
  return
end

local function cmd(name, op, opts)
  opts.desc = 'llamad: ' .. opts.desc
  vim.api.nvim_create_user_command(name, function(o) require('llamad').command(op, o) end, opts)
end

local function complete_sessions(lead)
  local out = {}
  for _, s in ipairs(require('llamad').known_sessions()) do
    if s:sub(1, #lead) == lead then out[#out + 1] = s end
  end
  return out
end

cmd('LlamadSend', 'send', { range = true, nargs = '*', desc = 'send the range, the buffer or the arguments; answer in llamad://SESSION' })
cmd('LlamadInsert', 'insert', { range = true, nargs = '*', desc = 'send like LlamadSend; answer at the cursor' })
cmd('LlamadCancel', 'cancel', { nargs = 0, desc = 'cancel the running answer' })
cmd('LlamadFork', 'fork', { nargs = 1, complete = complete_sessions, desc = 'fork the session into NAME and continue there' })
cmd('LlamadTranscript', 'transcript', { nargs = '?', count = 0, desc = 'show the last N turns of the session' })
cmd('LlamadSessions', 'sessions', { nargs = 0, desc = 'list the sessions' })
cmd('LlamadSession', 'session', { nargs = '?', bang = true, complete = complete_sessions, desc = 'show or switch the session (!: back to the default)' })
