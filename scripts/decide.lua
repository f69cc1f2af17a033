#!lua flags=allow-cross-slot-keys
-- decide.lua decides a batch of requests in one call. Each request is
-- decided all or nothing, in order: if any of its rules denies, none of its
-- rules consumes anything, and a later request of the batch sees what an
-- earlier one consumed. It is algo/eval.go and algo/log.go in Lua, step for
-- step and in the same order of floating-point operations; the differential
-- test in package store/redis holds the two to identical answers.
--
-- KEYS: none with a standalone or Sentinel client (the keys are in ARGV[1]);
--       in Redis Cluster, every key of the batch, all of one hash slot, so
--       the cluster routes the call and checks the slot, or, in a batch of
--       several slots of one primary (flag 2), those of its first slot.
--       The script reads its keys from ARGV[1] either way.
-- ARGV[1]: little-endian binary (struct formats in brackets), one of three
--   layouts, told apart by the first byte (an algorithm, 7 or 0):
--   one rule a call of one request of one rule (not sliding_window_log)
--            that wants no refund token, every call at low load: [B] its
--            algorithm (below), [H] key length and the key, [d] limit,
--            [d] window (µs), [d] max cost, [B] flags (1 shadow, 2 a
--            pinned time follows), [d] cost, for a bucket [d] burst and
--            [d] delay (µs), and with flag 2 [d] the time as below
--   flat     a call of one request of several rules, none
--            sliding_window_log, that wants no refund token, every call
--            at low load of a route with several rules: [B] 7, [H] 0,
--            [d] the time as below, [d] the number of rules, then per
--            rule [B] algorithm, [B] shadow, [d] limit, [d] window (µs),
--            [d] burst, [d] delay (µs), [d] max cost, [d] cost, then per
--            rule [H] key length and the key
--   batch    three zero bytes, then
--   header   [d] the time in µs since 2020-01-01T00:00:00Z, or -1 to read
--                Redis TIME (production always reads TIME, so replicas with
--                skewed clocks agree; only tests pin the time)
--            [H] the number of requests, [H] the number of policies,
--            [B] flags: 1 = reply with a refund token per rule, 2 = keys
--                of several Redis Cluster slots (see below)
--   policies per policy the batch's rules use, each once: [B] algorithm
--            (1 fixed_window, 2 sliding_window_log,
--            3 sliding_window_counter, 4 token_bucket, 5 leaky_bucket,
--            6 gcra), [d] limit, [d] window (µs), [d] burst, [d] delay
--            (µs), [d] max cost (the largest cost the policy ever admits)
--   requests per request: [B] the number of rules, [d] the request's id
--            (unique to the caller, below 2^52), then per rule: [H] its
--            policy's place in the policies above (0 for the first),
--            [B] shadow (1: its denial does not deny), [d] cost, [H] key
--            length and the key
--   The batch after its three zero bytes is the previous release's whole
--   argument, which the store sends a script of that release (tests),
--   never the other layouts.
-- Reply: one string, little-endian binary: per request, [B] admitted
--   (1 or 0), then per rule [B] allowed (1 or 0), [B] reason (0 none,
--   1 limited, 2 cost too high), [d] remaining, [d] reset after (µs),
--   [d] retry after (µs), [d] delay (µs), and with flag 1 [d] a refund
--   token for refund.lua: the window index written (fixed_window,
--   sliding_window_counter), the entry's time (sliding_window_log), 0 for
--   the others. A request of one rule that it admits with no delay, when no
--   refund token is wanted, answers [B] 2, [d] remaining, [d] reset after
--   instead; and a call of only such a request answers one integer,
--   remaining + (capacity + 1) * reset after (capacity: the burst of a
--   bucket, else the limit), when that is below 2^53, which Redis answers
--   far more cheaply than a string. A call in the flat layout answers as
--   a batch of its one request, or, if every rule admits it with no
--   delay, [B] 3, then per rule [d] remaining, [d] reset after. Every value is a whole number; Go reads
--   it as C casts a Lua number to a Redis integer (towards zero). One
--   string, packed here, costs Redis a third of what an array of integers
--   does to convert. An admitted request's allowing rules answer with their
--   counts after consuming; otherwise every rule answers with the counts
--   that stand.
--
-- State, by algorithm, each in one key that expires when its state no longer
-- matters (a bucket's: a full refill or drain after its last write; hex
-- integers are written with %x, which keeps the keys Redis holds most of
-- small):
--   fixed_window            string "<window index>:<count>" in hex
--   sliding_window_counter  string "<window index>:<count>:<previous count>"
--   token_bucket            string [dd]: last update (µs), tokens
--   leaky_bucket, gcra      string [dd]: last update (µs), level
--   sliding_window_log      sorted set: per admission, scored by its time, a
--                           member that is the running total of costs up to
--                           and including it (14 hex digits, so that members
--                           of one time sort in order), ':' and the
--                           request's id in hex (so a refund finds it), and
--                           a first member "00000000000000" scored -inf. The entry at or
--                           before the window's edge with the greatest time
--                           is always kept, so the window holds the newest
--                           total minus that entry's total, found in
--                           O(log n) however long the log.
-- Every value is computed and checked before the first write, so a call
-- never fails halfway; a key of the wrong type reads as no state and is
-- replaced; a key that cannot be read (an ACL that denies it) fails the
-- call before anything is written.
--
-- What each path costs Redis, and why the script is written as it is (a
-- path per layout, the windows of the one-rule layout in the chunk itself,
-- functions that take what they use as arguments): scripts/PERF.md.

-- wire names: scripts/layout.go's; scripts.go puts each value in place of its
-- name, and drops this block, before Redis sees the script.
local FIXED_WINDOW = 1
local SLIDING_WINDOW_LOG = 2
local SLIDING_WINDOW_COUNTER = 3
local TOKEN_BUCKET = 4
local LEAKY_BUCKET = 5
local GCRA = 6
local REASON_NONE = 0
local REASON_LIMITED = 1
local REASON_COST_TOO_HIGH = 2
local BATCH_LAYOUT = 0
local FLAT_LAYOUT = 7
local LEAN_REPLY = 2
local FLAT_REPLY = 3
local FLAG_SHADOW = 1
local FLAG_PINNED_TIME = 2
local FLAG_REFUND_TOKENS = 1
local FLAG_SLOTS = 2
local FLAT_RULE_VALUES = 8
local POLICY_VALUES = 6
local EPOCH_MICROS = 1577836800000000

-- Globals and their fields are looked up once, into locals, the one-rule
-- path's first and the general path's after it.
local S, R, str = struct, redis, string
local sunpack, spack = S.unpack, S.pack
local call, pcall = R.call, R.pcall
local format, match = str.format, str.match
local tonumber = tonumber

-- One unpack reads the one-rule layout whole, and a batch's three zero
-- bytes as algorithm 0 and an empty key (and what follows as numbers it
-- then ignores).
local blob = ARGV[1]
local a, lk, L, W, M, sh, c, pos = sunpack('<BHc0dddBd', blob)
local now, nreq, npol, flags, B, D = -1
if a == FLAT_LAYOUT then
  -- The flat layout, read as an empty key, the time (L) and the number of
  -- rules (W), what follows being its first rule's.
  now, nreq, pos = L, W, 20
elseif a ~= BATCH_LAYOUT then
  if a >= TOKEN_BUCKET then
    B, D, pos = sunpack('<dd', blob, pos)
  end
  if sh >= FLAG_PINNED_TIME then
    sh, now = sh - FLAG_PINNED_TIME, sunpack('<d', blob, pos)
  end
  nreq, npol, flags = 1, 1, 0
else
  lk = nil
  now, nreq, npol, flags, pos = sunpack('<dHHB', blob, 4)
end
local slack = 0
if now < 0 then
  local t = call('TIME')
  -- Arithmetic converts the strings as tonumber does, without its call.
  now = t[1] * 1000000 + t[2] - EPOCH_MICROS
  if now < 0 then
    now = 0
  end
else
  -- A pinned clock runs apart from Redis's own, which expires keys: give
  -- tests an hour of slack so a key never expires under a test's feet.
  slack = 3600000
end
-- A window (fixed_window, sliding_window_counter) in the one-rule layout is
-- decided here, in the chunk itself, as single below decides one, line for
-- line: the closure single is and the call into it cost Redis as much as
-- the window's arithmetic (TestDifferential and TestBatchMatchesSequential
-- hold both to the memory store). A sliding_window_counter denied by its
-- limit goes on to the general path, which works out its wait.
-- The flat layout: one request of several rules, none sliding_window_log,
-- decided here, in the chunk itself, as rule below decides them, operation
-- for operation, with no function call: one unpack reads every rule into
-- V, whose slots then hold each rule's outcome, and one MGET reads every
-- key. MGET answers nil (false) for a key of another type, which reads as
-- no state and is replaced, as a GET's WRONGTYPE does; a key the user may
-- not read fails the call before anything is written.
if a == FLAT_LAYOUT then
  local n = nreq
  local f -- per rule [BBdddddd], then per rule [Hc0]
  if n == 2 then
    f = '<BBddddddBBddddddHc0Hc0'
  elseif n == 3 then
    f = '<BBddddddBBddddddBBddddddHc0Hc0Hc0'
  else
    f = '<' .. str.rep('BBdddddd', n) .. str.rep('Hc0', n)
  end
  local V = { sunpack(f, blob, pos) }
  local K = FLAT_RULE_VALUES * n -- the keys are V[K + 1] to V[K + n]
  local got
  if n == 2 then
    got = pcall('MGET', V[2 * FLAT_RULE_VALUES + 1], V[2 * FLAT_RULE_VALUES + 2])
  elseif n == 3 then
    got = pcall('MGET', V[3 * FLAT_RULE_VALUES + 1], V[3 * FLAT_RULE_VALUES + 2], V[3 * FLAT_RULE_VALUES + 3])
  else
    got = pcall('MGET', unpack(V, K + 1, K + n))
  end
  if got.err then
    -- A user not granted MGET (earlier releases did not need it), or a
    -- key it may not read: a GET each, which fails for the key.
    got = {}
    for j = 1, n do
      local v = pcall('GET', V[K + j])
      if v and v.err then
        if not str.find(v.err, 'WRONGTYPE', 1, true) then
          error(v) -- not a wrong type: the key cannot be read (an ACL, say)
        end
        v = false
      end
      got[j] = v
    end
  end
  local ceil = math.ceil
  -- Phase one: decide every rule without writing. A rule's eight slots,
  -- its algorithm, shadow, limit, window, burst, delay, max cost and cost,
  -- then hold its outcome: reason (0 admits, 1 limited, 2 cost too high),
  -- the counts as they stand (remaining, reset after), its retry after if
  -- denied or its delay if not, the counts after consuming (remaining,
  -- reset after), and what to write: the value and its expiry (ms), or,
  -- written in place, minus the length of the value read.
  local all, compact = 1, true
  for b = 0, K - FLAT_RULE_VALUES, FLAT_RULE_VALUES do
    local a, sh, L, W, B, D, M, c = V[b + 1], V[b + 2], V[b + 3], V[b + 4], V[b + 5], V[b + 6], V[b + 7], V[b + 8]
    local v = got[b / FLAT_RULE_VALUES + 1]
    local reason, hrem, hreset, x2, trem, treset, wval, wttl = REASON_LIMITED, 0, 0, 0, 0, 0, false, 0
    if a == FIXED_WINDOW or a == SLIDING_WINDOW_COUNTER then
      local w, m, x, z
      if v then
        x, m, z = match(v, '^(%x+):(%x+):?(%x*)$')
        if x then
          w, m = tonumber(x, 16), tonumber(m, 16)
        end
      end
      local idx = (now - now % W) / W
      if a == FIXED_WINDOW then -- fixed_window
        local cnt, keep = 0, false
        if w and w >= idx then
          idx, cnt, keep = w, m, true
        end
        local ending = (idx + 1) * W - now
        hrem = L - cnt
        if cnt > 0 then
          hreset = ending
        end
        if c > M or cnt + c > L then
          x2 = ending
        else
          reason, trem, treset = REASON_NONE, L - cnt - c, ending
          if keep then
            wval, wttl = x .. ':' .. format('%x', cnt + c), -#v
          else
            local ttl = ending / 1000
            if ttl % 1 > 0 then
              ttl = ttl - ttl % 1 + 1
            end
            if ttl < 1 then
              ttl = 1
            end
            wval, wttl = format('%x:%x', idx, cnt + c), ttl + slack
          end
        end
      else -- sliding_window_counter
        local cur, prev, keep = 0, 0, false
        if w then
          if w >= idx then
            idx, cur, keep = w, m, true
            if z == '' then
              z = '0'
            elseif z ~= '0' then
              prev = tonumber(z, 16)
            end
          elseif w == idx - 1 then
            prev = m
          end
        end
        local e = now - idx * W
        if e < 0 then
          e = 0
        end
        local est = prev * (W - e) / W + cur
        local left = L - est
        left = left - left % 1
        if left < 0 then
          left = 0
        end
        hrem = left
        if cur > 0 then
          hreset = 2 * W - e
        elseif prev > 0 then
          hreset = W - e
        end
        if c > M then
          -- denied: cost too high
        elseif est + c <= L then
          left = L - est - c
          left = left - left % 1
          if left < 0 then
            left = 0
          end
          reason, trem, treset = REASON_NONE, left, 2 * W - e
          if keep then
            wval, wttl = x .. ':' .. format('%x', cur + c) .. ':' .. z, -#v
          else
            local ttl = (2 * W - e) / 1000
            if ttl % 1 > 0 then
              ttl = ttl - ttl % 1 + 1
            end
            if ttl < 1 then
              ttl = 1
            end
            wval, wttl = format('%x:%x:%x', idx, cur + c, prev), ttl + slack
          end
        else
          -- The wait, as rule works it out.
          local wait
          if cur + c <= L then
            wait = math.max(ceil(W - (L - cur - c) * W / prev - e), 1)
          else
            wait = W - e + math.max(ceil(W - (L - c) * W / cur), 0)
          end
          for _ = 1, 4 do
            local at = now + wait
            local ix, cu, pr = (at - at % W) / W, 0, 0
            if w then
              if w >= ix then
                ix, cu, pr = w, m, prev -- w >= ix only if w >= idx: prev is its own
              elseif w == ix - 1 then
                pr = m
              end
            end
            local el = at - ix * W
            if el < 0 then
              el = 0
            end
            if pr * (W - el) / W + cu + c <= L then
              break
            end
            wait = wait + 1
          end
          x2 = wait
        end
      end
    else -- token_bucket (4); leaky_bucket (5) and gcra (6)
      local t, x
      if v and #v == 16 then
        t, x = sunpack('<dd', v)
      end
      local level, reset
      if a == TOKEN_BUCKET then
        level = B
        if t then
          local dt = now - t
          if dt < 0 then
            dt = 0
          end
          level = x + dt * L / W
          if level > B then
            level = B
          end
        end
        hrem = level - level % 1
        reset = (B - level) * W / L
      else
        level = 0
        if t then
          local dt = now - t
          if dt < 0 then
            dt = 0
          end
          level = x - dt * L / W
          if level < 0 then
            level = 0
          end
        end
        local left = B - level
        left = left - left % 1
        if left < 0 then
          left = 0
        end
        hrem = left
        reset = level * W / L
      end
      local fl = reset - reset % 1
      if fl < reset then
        reset = fl + 1
      end
      hreset = reset
      if c > M then
        -- denied: cost too high
      elseif a == TOKEN_BUCKET then
        if level < c then
          local wait = ceil((c - level) * W / L)
          for _ = 1, 4 do
            local lv = B -- the level at now + wait, as level_at works it out
            if t then
              local dt = now + wait - t
              if dt < 0 then
                dt = 0
              end
              lv = x + dt * L / W
              if lv > B then
                lv = B
              end
            end
            if lv >= c then
              break
            end
            wait = wait + 1
          end
          x2 = wait
        else
          level = level - c
          reset = (B - level) * W / L
          fl = reset - reset % 1
          if fl < reset then
            reset = fl + 1
          end
          reason, trem, treset = REASON_NONE, level - level % 1, reset
        end
      else
        local over, wait = level + c - B, 0
        if over > 0 then
          wait = ceil(over * W / L)
        end
        if wait > D then
          local retry = wait - D
          for _ = 1, 4 do
            local lv = 0 -- the level at now + retry, as level_at works it out
            if t then
              local dt = now + retry - t
              if dt < 0 then
                dt = 0
              end
              lv = x - dt * L / W
              if lv < 0 then
                lv = 0
              end
            end
            local o = lv + c - B
            if o <= 0 or ceil(o * W / L) <= D then
              break
            end
            retry = retry + 1
          end
          x2 = retry
        else
          level = level + c
          local left = B - level
          left = left - left % 1
          if left < 0 then
            left = 0
          end
          reset = level * W / L
          fl = reset - reset % 1
          if fl < reset then
            reset = fl + 1
          end
          reason, trem, treset, x2 = REASON_NONE, left, reset, wait
          if wait > 0 then
            compact = false
          end
        end
      end
      if reason == REASON_NONE then
        local H = B * W / L -- the key's whole horizon, as rule writes it
        if a ~= TOKEN_BUCKET then
          H = H + D
        end
        H = H / 1000
        if H % 1 > 0 then
          H = H - H % 1 + 1
        end
        if H < 1 then
          H = 1
        end
        wval, wttl = spack('<dd', now, level), H + slack
      end
    end
    if c > M then
      reason, x2 = REASON_COST_TOO_HIGH, 0
    end
    if reason ~= REASON_NONE then
      compact = false
      if sh ~= FLAG_SHADOW then
        all = 0
      end
    end
    V[b + 1], V[b + 2], V[b + 3], V[b + 4], V[b + 5], V[b + 6], V[b + 7], V[b + 8] = reason, hrem, hreset, x2, trem, treset, wval, wttl
  end
  -- Phase two: only if the request is admitted, write.
  if all == 1 then
    for b = 0, K - FLAT_RULE_VALUES, FLAT_RULE_VALUES do
      if V[b + 1] == REASON_NONE then
        local k, wval, wttl = V[K + b / FLAT_RULE_VALUES + 1], V[b + 7], V[b + 8]
        if wttl > 0 then
          call('SET', k, wval, 'PX', format('%d', wttl))
        elseif #wval ~= -wttl or pcall('SETRANGE', k, '0', wval) ~= -wttl then
          call('SET', k, wval, 'KEEPTTL') -- in place if it keeps its length (see single)
        end
      end
    end
  end
  -- Every rule admitting with no delay answers [B] 3, then per rule [d]
  -- remaining and [d] reset after, consumed.
  if compact then
    if n == 2 then
      return spack('<Bdddd', FLAT_REPLY, V[5], V[6], V[FLAT_RULE_VALUES + 5], V[FLAT_RULE_VALUES + 6])
    elseif n == 3 then
      return spack('<Bdddddd', FLAT_REPLY, V[5], V[6], V[FLAT_RULE_VALUES + 5], V[FLAT_RULE_VALUES + 6], V[2 * FLAT_RULE_VALUES + 5], V[2 * FLAT_RULE_VALUES + 6])
    end
    local out = { spack('<B', FLAT_REPLY) }
    for b = 0, K - FLAT_RULE_VALUES, FLAT_RULE_VALUES do
      out[#out + 1] = spack('<dd', V[b + 5], V[b + 6])
    end
    return table.concat(out)
  end
  -- Otherwise the batch's reply for one request (see rule).
  local out = {}
  for b = 0, K - FLAT_RULE_VALUES, FLAT_RULE_VALUES do
    local reason, rem, reset, retry, delay = V[b + 1], V[b + 2], V[b + 3], V[b + 4], 0
    local ok = 0
    if reason == REASON_NONE then
      ok, retry = 1, 0
      if all == 1 then
        rem, reset, delay = V[b + 5], V[b + 6], V[b + 4]
      end
    end
    if b == 0 then
      out[1] = spack('<BBBdddd', all, ok, reason, rem, reset, retry, delay)
    else
      out[b / FLAT_RULE_VALUES + 1] = spack('<BBdddd', ok, reason, rem, reset, retry, delay)
    end
  end
  return table.concat(out)
end

if lk and a < TOKEN_BUCKET then
  local v = pcall('GET', lk)
  local w, n, x, z
  if v then
    if #v == 0 then
      -- An error (a table, whose length is 0) or an empty string.
      local e = v.err
      if e and not string.find(e, 'WRONGTYPE', 1, true) then
        error(v) -- not a wrong type: the key cannot be read (an ACL, say)
      end
    else
      local y
      x, y, z = match(v, '^(%x+):(%x+):?(%x*)$')
      if x then
        w, n = tonumber(x, 16), tonumber(y, 16)
      end
    end
  end
  local idx = (now - now % W) / W
  local rem, reset -- an admission's
  if a == FIXED_WINDOW then -- fixed_window
    local cnt, keep = 0, false
    if w and w >= idx then
      idx, cnt, keep = w, n, true
    end
    local ending = (idx + 1) * W - now
    if c > M or cnt + c > L then
      local all, r = 0, 0
      if sh == FLAG_SHADOW then
        all = 1
      end
      if cnt > 0 then
        r = ending
      end
      if c > M then
        return spack('<BBBdddd', all, 0, REASON_COST_TOO_HIGH, L - cnt, r, 0, 0, 0)
      end
      return spack('<BBBdddd', all, 0, REASON_LIMITED, L - cnt, r, ending, 0, 0)
    end
    if keep then
      local nv = x .. ':' .. format('%x', cnt + c) -- see single
      if #nv ~= #v or pcall('SETRANGE', lk, '0', nv) ~= #v then
        call('SET', lk, nv, 'KEEPTTL') -- see single
      end
    else
      local ttl = ending / 1000
      if ttl % 1 > 0 then
        ttl = ttl - ttl % 1 + 1
      end
      if ttl < 1 then
        ttl = 1
      end
      call('SET', lk, format('%x:%x', idx, cnt + c), 'PX', ttl + slack)
    end
    rem, reset = L - cnt - c, ending
  else -- sliding_window_counter
    local cur, prev, keep = 0, 0, false
    if w then
      if w >= idx then
        idx, cur, keep = w, n, true
        if z == '' then
          z = '0'
        elseif z ~= '0' then
          prev = tonumber(z, 16)
        end
      elseif w == idx - 1 then
        prev = n
      end
    end
    local e = now - idx * W
    if e < 0 then
      e = 0
    end
    local est = prev * (W - e) / W + cur
    if c <= M and est + c <= L then
      local left = L - est - c
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      if keep then
        local nv = x .. ':' .. format('%x', cur + c) .. ':' .. z
        if #nv ~= #v or pcall('SETRANGE', lk, '0', nv) ~= #v then
          call('SET', lk, nv, 'KEEPTTL') -- see single
        end
      else
        local ttl = (2 * W - e) / 1000
        if ttl % 1 > 0 then
          ttl = ttl - ttl % 1 + 1
        end
        if ttl < 1 then
          ttl = 1
        end
        call('SET', lk, format('%x:%x:%x', idx, cur + c, prev), 'PX', ttl + slack)
      end
      rem, reset = left, 2 * W - e
    elseif c > M then
      local all, left, r = 0, L - est, 0
      if sh == FLAG_SHADOW then
        all = 1
      end
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      if cur > 0 then
        r = 2 * W - e
      elseif prev > 0 then
        r = W - e
      end
      return spack('<BBBdddd', all, 0, REASON_COST_TOO_HIGH, left, r, 0, 0, 0)
    end
  end
  if rem then
    -- Admitted: see the one-rule call below.
    local r = reset * (L + 1) + rem
    if r < 9007199254740992 then
      return r
    end
    return spack('<Bdd', LEAN_REPLY, rem, reset)
  end
end

local tokens_wanted = flags % (2 * FLAG_REFUND_TOKENS) >= FLAG_REFUND_TOKENS
-- The reply formats of a request's first rule (with its admitted byte) and
-- of the others, with or without refund tokens.
local FIRST, NEXT = '<BBBdddd', '<BBdddd'
if tokens_wanted then
  FIRST, NEXT = '<BBBddddd', '<BBddddd'
end

-- single decides, writes and answers a request of one rule of any
-- algorithm but sliding_window_log, the shape of every call at low load and
-- of most requests of a batch, with no tables and no closures of its own:
-- its reply (in FIRST's format), or nil for a denial that must work out its
-- wait, which the general path below then decides. Its arithmetic is the
-- general path's, operation for operation. It takes what it uses as
-- arguments, not as upvalues: making a closure with upvalues costs Redis
-- several times what the call does.
local function single(a, L, W, B, D, M, sh, c, k, now, slack, FIRST, lean, sunpack, spack, call, pcall, format, match, tonumber)
  if a == FIXED_WINDOW or a == SLIDING_WINDOW_COUNTER then -- fixed_window, sliding_window_counter
    local v = pcall('GET', k)
    local w, n, x, z
    if v then
      if #v == 0 then
        -- An error (a table, whose length is 0) or an empty string.
        local e = v.err
        if e and not string.find(e, 'WRONGTYPE', 1, true) then
          error(v) -- not a wrong type: the key cannot be read (an ACL, say)
        end
      else
        local y
        x, y, z = match(v, '^(%x+):(%x+):?(%x*)$')
        if x then
          w, n = tonumber(x, 16), tonumber(y, 16)
        end
      end
    end
    local idx = (now - now % W) / W
    -- What only a denial answers is worked out only for one.
    if a == FIXED_WINDOW then -- fixed_window
      local cnt, keep = 0, false
      if w and w >= idx then
        idx, cnt, keep = w, n, true
      end
      local ending = (idx + 1) * W - now
      if c > M or cnt + c > L then
        local all, reset = 0, 0
        if sh == FLAG_SHADOW then
          all = 1
        end
        if cnt > 0 then
          reset = ending
        end
        if c > M then
          return spack(FIRST, all, 0, REASON_COST_TOO_HIGH, L - cnt, reset, 0, 0, 0)
        end
        return spack(FIRST, all, 0, REASON_LIMITED, L - cnt, reset, ending, 0, 0)
      end
      if keep then
        -- The window's index as read. A value of the same length is
        -- written over the old in place: SETRANGE keeps the expiry as
        -- KEEPTTL does, and answers an integer (the length) where SET's
        -- OK costs Redis a table; a longer one (rarely) is SET, which
        -- sizes it exactly, and so is any value if SETRANGE fails (a
        -- user whose ACL does not grant it).
        local nv = x .. ':' .. format('%x', cnt + c)
        if #nv ~= #v or pcall('SETRANGE', k, '0', nv) ~= #v then
          call('SET', k, nv, 'KEEPTTL')
        end
      else
        local ttl = ending / 1000
        if ttl % 1 > 0 then
          ttl = ttl - ttl % 1 + 1
        end
        if ttl < 1 then
          ttl = 1
        end
        call('SET', k, format('%x:%x', idx, cnt + c), 'PX', ttl + slack)
      end
      if lean then
        return L - cnt - c, ending
      end
      return spack(FIRST, 1, 1, REASON_NONE, L - cnt - c, ending, 0, 0, idx)
    end
    -- sliding_window_counter
    local cur, prev, keep = 0, 0, false
    if w then
      if w >= idx then
        idx, cur, keep = w, n, true
        if z == '' then
          z = '0'
        elseif z ~= '0' then
          prev = tonumber(z, 16)
        end
      elseif w == idx - 1 then
        prev = n
      end
    end
    local e = now - idx * W
    if e < 0 then
      e = 0
    end
    local est = prev * (W - e) / W + cur
    if c <= M and est + c <= L then
      local left = L - est - c
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      if keep then
        local nv = x .. ':' .. format('%x', cur + c) .. ':' .. z -- see fixed_window
        if #nv ~= #v or pcall('SETRANGE', k, '0', nv) ~= #v then
          call('SET', k, nv, 'KEEPTTL')
        end
      else
        local ttl = (2 * W - e) / 1000
        if ttl % 1 > 0 then
          ttl = ttl - ttl % 1 + 1
        end
        if ttl < 1 then
          ttl = 1
        end
        call('SET', k, format('%x:%x:%x', idx, cur + c, prev), 'PX', ttl + slack)
      end
      if lean then
        return left, 2 * W - e
      end
      return spack(FIRST, 1, 1, REASON_NONE, left, 2 * W - e, 0, 0, idx)
    elseif c > M then
      local all, left, reset = 0, L - est, 0
      if sh == FLAG_SHADOW then
        all = 1
      end
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      if cur > 0 then
        reset = 2 * W - e
      elseif prev > 0 then
        reset = W - e
      end
      return spack(FIRST, all, 0, REASON_COST_TOO_HIGH, left, reset, 0, 0, 0)
    end
    -- Denied: the general path works out the wait.
  elseif a == TOKEN_BUCKET or a == LEAKY_BUCKET or a == GCRA then -- token_bucket; leaky_bucket and gcra
    local v = pcall('GET', k)
    local t, x
    if v then
      -- A string's err is nil, read with no call into C.
      local e = v.err
      if e then
        if not string.find(e, 'WRONGTYPE', 1, true) then
          error(v) -- not a wrong type: the key cannot be read (an ACL, say)
        end
      elseif #v == 16 then
        t, x = sunpack('<dd', v)
      end
    end
    -- The level now, as level_at below works it out, and x - x % 1 as
    -- floor(x), exactly.
    local level, rem, reset, delay
    if a == TOKEN_BUCKET then
      level = B
      if t then
        local dt = now - t
        if dt < 0 then
          dt = 0
        end
        level = x + dt * L / W
        if level > B then
          level = B
        end
      end
      rem, reset = level - level % 1, (B - level) * W / L
    else
      level = 0
      if t then
        local dt = now - t
        if dt < 0 then
          dt = 0
        end
        level = x - dt * L / W
        if level < 0 then
          level = 0
        end
      end
      rem, reset = B - level, level * W / L
      rem = rem - rem % 1
      if rem < 0 then
        rem = 0
      end
    end
    local f = reset - reset % 1
    if f < reset then
      reset = f + 1
    end
    if c > M then
      local all = 0
      if sh == FLAG_SHADOW then
        all = 1
      end
      return spack(FIRST, all, 0, REASON_COST_TOO_HIGH, rem, reset, 0, 0, 0)
    end
    local admit = false
    if a == TOKEN_BUCKET then
      if level >= c then
        admit, level, delay = true, level - c, 0
        rem, reset = level - level % 1, (B - level) * W / L
      end
    else
      local over, wait = level + c - B, 0
      if over > 0 then
        wait = math.ceil(over * W / L)
      end
      if wait <= D then
        admit, level, delay = true, level + c, wait
        rem, reset = B - level, level * W / L
        rem = rem - rem % 1
        if rem < 0 then
          rem = 0
        end
      end
    end
    if admit then
      f = reset - reset % 1
      if f < reset then
        reset = f + 1
      end
      -- The key's whole horizon, as the general path writes it.
      local H = B * W / L
      if a ~= TOKEN_BUCKET then
        H = H + D
      end
      H = H / 1000
      if H % 1 > 0 then
        H = H - H % 1 + 1
      end
      if H < 1 then
        H = 1
      end
      call('SET', k, spack('<dd', now, level), 'PX', format('%d', H + slack))
      if lean and delay == 0 then
        return rem, reset
      end
      return spack(FIRST, 1, 1, REASON_NONE, rem, reset, 0, delay, 0)
    end
    -- Denied: the general path works out the wait.
  end
end

-- One request (so one rule: a request names a policy once).
if lk or nreq == 1 and npol == 1 then
  local k = lk
  if not k then
    local _
    a, L, W, B, D, M, _, _, _, sh, c, k = sunpack('<BdddddBdHBdHc0', blob, pos)
  end
  local s, reset
  if a ~= SLIDING_WINDOW_LOG and (not lk or a >= TOKEN_BUCKET) then -- a window in the one-rule layout was decided above
    s, reset = single(a, L, W, B, D, M, sh, c, k, now, slack, FIRST, not tokens_wanted, sunpack, spack, call, pcall, format, match, tonumber)
  end
  if reset then
    -- Admitted: remaining + (capacity + 1) * reset after, one integer.
    local v = L
    if a >= TOKEN_BUCKET then
      v = B
    end
    v = reset * (v + 1) + s
    if v < 9007199254740992 then
      return v
    end
    return spack('<Bdd', LEAN_REPLY, s, reset)
  end
  if s then
    return s
  end
  if lk then
    -- Denied, and the general path works out the wait: from the batch
    -- the call would otherwise have been.
    blob, pos = spack('<BdddddBdHBdH', a, L, W, B or 0, D or 0, M, 1, 0, 0, sh, c, #lk) .. lk, 1
  end
end

-- What only a rare path uses (math's, string.sub) it looks up itself.
local find, rep, concat = str.find, str.rep, table.concat

-- Policies, POLICY_VALUES values each from V[POLICY_VALUES * place + 1], in one table built by its
-- constructor from one unpack: a table per policy, or a table that grows by
-- assignment (rehashed at every power of two), costs Redis more than the
-- rest of a decision.
local V
if npol == 1 then
  V = { sunpack('<Bddddd', blob, pos) }
  pos = V[POLICY_VALUES + 1]
elseif npol <= 32 then
  local f = '<BdddddBddddd' -- two, three or more, with no call into C for a few
  if npol == 3 then
    f = '<BdddddBdddddBddddd'
  elseif npol > 3 then
    f = '<' .. rep('Bddddd', npol)
  end
  V = { sunpack(f, blob, pos) }
  pos = V[POLICY_VALUES * npol + 1]
else
  -- More values than one call should push at once: a policy at a time.
  V = {}
  for j = 0, POLICY_VALUES * (npol - 1), POLICY_VALUES do
    V[j + 1], V[j + 2], V[j + 3], V[j + 4], V[j + 5], V[j + 6], pos = sunpack('<Bddddd', blob, pos)
  end
end

-- A Redis Cluster batch of several slots (flag 2) declares the keys of one
-- slot only, which routes it, and reads the others' from ARGV, as the
-- script's flag allow-cross-slot-keys lets it. Before anything is written,
-- every key is touched once (EXISTS), so that a key whose slot this node
-- does not serve at the moment (moved, migrating away with the key gone,
-- or a cluster down) fails the call before it decides anything: it
-- answers TRYAGAIN, which the store takes for a call that did not run,
-- and sends its requests again, slot by slot, where Redis's redirections
-- lead. So does a call of a user not granted EXISTS (earlier releases
-- needed it only for refunds), each of whose slots then decides as its
-- own call would.
if flags % (2 * FLAG_SLOTS) >= FLAG_SLOTS then
  local p = pos
  for _ = 1, nreq do
    local nrules
    nrules, p = sunpack('<B', blob, p)
    p = p + 8 -- the request's id
    for _ = 1, nrules do
      local k
      k, p = sunpack('<Hc0', blob, p + 11) -- after its policy, shadow and cost
      local e = pcall('EXISTS', k)
      if e ~= 0 and e ~= 1 then -- an error
        return R.error_reply('TRYAGAIN a key of the batch could not be touched here (' .. e.err .. '): sent again slot by slot')
      end
    end
  end
end

-- hexes reads "a:b" or "a:b:c" (c = 0 for the first), and v's length; nil
-- if v is not one.
-- v is what redis.pcall answered: a string, false (no key) or an error
-- (a table with err); a string's err is nil, read with no call into C.
local function hexes(v)
  if not v then
    return nil
  end
  local e = v.err
  if e then
    if not find(e, 'WRONGTYPE', 1, true) then
      error(v) -- not a wrong type: the key cannot be read (an ACL, say)
    end
    return nil
  end
  local a, b, c = match(v, '^(%x+):(%x+):?(%x*)$')
  if not a then
    return nil
  end
  if c == '' then
    return tonumber(a, 16), tonumber(b, 16), 0, #v
  end
  return tonumber(a, 16), tonumber(b, 16), tonumber(c, 16), #v
end

-- level_at is a bucket's level at a time: a token bucket's tokens
-- (a == TOKEN_BUCKET), refilling up to B, or a leaky bucket's (and gcra's)
-- level, draining to 0, from the state (t, x) read, if any. The
-- level now is worked out inline below, the same way: a closure
-- and a call cost Redis more than the arithmetic.
local function level_at(a, t, x, B, L, W, at)
  if a == TOKEN_BUCKET then
    if not t then
      return B
    end
    local dt = at - t
    if dt < 0 then
      dt = 0
    end
    local v = x + dt * L / W
    if v > B then
      return B
    end
    return v
  end
  if not t then
    return 0
  end
  local dt = at - t
  if dt < 0 then
    dt = 0
  end
  local v = x - dt * L / W
  if v < 0 then
    return 0
  end
  return v
end

-- rule decides the i-th rule of a request of several (the general path),
-- from pos in the batch, then, by calling itself, the rules after it, and
-- then, with the request's verdict (all) known, writes its own if the
-- request is admitted and answers in reply[r0 + i]: every rule reads before
-- any writes, and a rule's answer and what it writes stay in the call's
-- locals (upper case) rather than in a table, which costs Redis more. It
-- returns the verdict and where the request ends in the batch. It takes
-- what it uses as arguments, not as upvalues (see single).
local function rule(i, nrules, all, pos, r0, rid, blob, V, now, slack, reply, FIRST, NEXT, hexes, level_at, rule, sunpack, spack, call, pcall, format)
  local REBASE = 4503599627370496 -- 2^52: a log's totals restart below this
  local SWEEP = 64 -- left-behind log entries removed per admission, at most
  local RETRY_STEPS = 4
  -- Phase one: decide without writing. A key expires (ttl, in ms) when its
  -- state no longer matters; a pinned clock adds slack.
  local id, sh, c, k
  id, sh, c, k, pos = sunpack('<HBdHc0', blob, pos)
  local v = POLICY_VALUES * id
  local a, L, W, B, D, M = V[v + 1], V[v + 2], V[v + 3], V[v + 4], V[v + 5], V[v + 6]
  local OK, HREM, HRESET, HRETRY, TDELAY, TOKEN = 0, 0, 0, 0, 0, 0
  local TREM, TRESET, WVAL, WTTL, WLEN, LAT, LRANK, LTOTAL
  if a == FIXED_WINDOW then -- fixed_window
    local idx, n, keep = (now - now % W) / W, 0, false
    local w, cnt, _, len = hexes(pcall('GET', k))
    if w and w >= idx then
      -- Now's window, or a later one (the clock stepped back): its
      -- key already expires when the window ends.
      idx, n, keep = w, cnt, true
    end
    local ending = (idx + 1) * W - now
    HREM = L - n
    if n > 0 then
      HRESET = ending
    end
    if c > M or n + c > L then
      HRETRY = ending
    else
      OK, TREM, TRESET = 1, L - n - c, ending
      WVAL, TOKEN = format('%x:%x', idx, n + c), idx
      if keep then
        WTTL, WLEN = 0, len
      else
        local ttl = ending / 1000
        if ttl % 1 > 0 then
          ttl = ttl - ttl % 1 + 1
        end
        if ttl < 1 then
          ttl = 1
        end
        WTTL = ttl + slack
      end
    end
  elseif a == SLIDING_WINDOW_COUNTER then -- sliding_window_counter
    local w, n, pv, len = hexes(pcall('GET', k))
    local idx, cur, prev, keep = (now - now % W) / W, 0, 0, false
    if w then
      if w >= idx then
        -- The key already expires a window after this one.
        idx, cur, prev, keep = w, n, pv, true
      elseif w == idx - 1 then
        prev = n
      end
    end
    local e = now - idx * W -- elapsed in the current window
    if e < 0 then
      e = 0
    end
    local est = prev * (W - e) / W + cur
    -- x - x % 1 is floor(x), exactly, without a call into C, which
    -- costs Redis more than the arithmetic.
    local left = L - est
    left = left - left % 1
    if left < 0 then
      left = 0
    end
    HREM = left
    if cur > 0 then
      HRESET = 2 * W - e
    elseif prev > 0 then
      HRESET = W - e
    end
    if c > M then
      -- denied: cost too high
    elseif est + c <= L then
      left = L - est - c
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      OK, TREM, TRESET = 1, left, 2 * W - e
      WVAL, TOKEN = format('%x:%x:%x', idx, cur + c, prev), idx
      if keep then
        WTTL, WLEN = 0, len
      else
        local ttl = (2 * W - e) / 1000
        if ttl % 1 > 0 then
          ttl = ttl - ttl % 1 + 1
        end
        if ttl < 1 then
          ttl = 1
        end
        WTTL = ttl + slack
      end
    else
      local max = math.max
      local wait
      if cur + c <= L then
        -- Only the previous window's weight must shrink.
        wait = max(math.ceil(W - (L - cur - c) * W / prev - e), 1)
      else
        -- Wait into the next window, where this window's count is the
        -- previous.
        wait = W - e + max(math.ceil(W - (L - c) * W / cur), 0)
      end
      -- Check the wait against the state as it stands.
      local function admits(at)
        local ix, cu, pr = (at - at % W) / W, 0, 0
        if w then
          if w >= ix then
            ix, cu, pr = w, n, pv
          elseif w == ix - 1 then
            pr = n
          end
        end
        local el = max(at - ix * W, 0)
        return pr * (W - el) / W + cu + c <= L
      end
      for _ = 1, RETRY_STEPS do
        if admits(now + wait) then
          break
        end
        wait = wait + 1
      end
      HRETRY = wait
    end
  elseif a == SLIDING_WINDOW_LOG then -- sliding_window_log
    local sub, floor, max = string.sub, math.floor, math.max
    -- Constant arguments are strings: Redis converts a number argument
    -- with a printf of its own.
    local newest = pcall('ZRANGE', k, '-1', '-1', 'WITHSCORES')
    local total, before, rank = 0, 0, -1
    local at = now
    WVAL = 'fresh'
    if type(newest) ~= 'table' or newest.err then
      hexes(newest) -- raises if the key cannot be read
      WVAL = 'replace' -- a key of another type
    elseif #newest > 0 then
      WVAL = 'append'
      total = tonumber(sub(newest[1], 1, 14), 16)
      local ts = tonumber(newest[2])
      at = max(now, ts)
      -- The entry at or before the edge with the greatest time: the
      -- window holds what came after it.
      local edge = call('ZRANGE', k, now - W, '-inf', 'BYSCORE', 'REV', 'LIMIT', '0', '1')
      before = tonumber(sub(edge[1], 1, 14), 16)
      rank = call('ZRANK', k, edge[1])
      if total - before > 0 then
        HRESET = ts + W - now
      end
    end
    local n = total - before
    HREM = L - n
    if c > M then
      -- denied: cost too high
    elseif n + c > L then
      -- The oldest entries must leave until the request fits: find the
      -- first whose total frees enough, by binary search on rank.
      local want = before + n + c - L
      local lo, hi = rank + 1, -1
      if WVAL == 'append' then
        hi = call('ZCARD', k) - 1
      end
      while lo < hi do
        local mid = floor((lo + hi) / 2)
        if tonumber(sub(call('ZRANGE', k, mid, mid)[1], 1, 14), 16) >= want then
          hi = mid
        else
          lo = mid + 1
        end
      end
      HRETRY = tonumber(call('ZRANGE', k, lo, lo, 'WITHSCORES')[2]) + W - now
    else
      OK, TREM, TRESET = 1, L - n - c, at + W - now
      LAT, LRANK, WTTL, TOKEN = at, rank, max(math.ceil((at + W - now) / 1000), 1) + slack, at
      LTOTAL = total + c
    end
  else -- token_bucket (4); leaky_bucket (5) and gcra (6), which is one with it
    local t, x
    local v = pcall('GET', k)
    if v then
      local e = v.err
      if e then
        if not string.find(e, 'WRONGTYPE', 1, true) then
          error(v) -- not a wrong type: the key cannot be read (an ACL, say)
        end
      elseif #v == 16 then
        t, x = sunpack('<dd', v)
      end
    end
    -- x - x % 1 is floor(x), and f + 1 where f < x ceil(x), exactly.
    local level, reset
    if a == TOKEN_BUCKET then
      level = B
      if t then
        local dt = now - t
        if dt < 0 then
          dt = 0
        end
        level = x + dt * L / W
        if level > B then
          level = B
        end
      end
      HREM = level - level % 1
      reset = (B - level) * W / L
    else
      level = 0
      if t then
        local dt = now - t
        if dt < 0 then
          dt = 0
        end
        level = x - dt * L / W
        if level < 0 then
          level = 0
        end
      end
      local left = B - level
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      HREM = left
      reset = level * W / L
    end
    local f = reset - reset % 1
    if f < reset then
      reset = f + 1
    end
    HRESET = reset
    if c > M then
      -- denied: cost too high
    elseif a == TOKEN_BUCKET then
      if level < c then
        local wait = math.ceil((c - level) * W / L)
        for _ = 1, RETRY_STEPS do
          if level_at(a, t, x, B, L, W, now + wait) >= c then
            break
          end
          wait = wait + 1
        end
        HRETRY = wait
      else
        level = level - c
        reset = (B - level) * W / L
        f = reset - reset % 1
        if f < reset then
          reset = f + 1
        end
        OK, TREM, TRESET = 1, level - level % 1, reset
      end
    else
      -- The request waits until enough has drained for it to fit.
      local over, wait = level + c - B, 0
      if over > 0 then
        wait = math.ceil(over * W / L)
      end
      if wait > D then
        local retry = wait - D
        for _ = 1, RETRY_STEPS do
          local o = level_at(a, t, x, B, L, W, now + retry) + c - B
          if o <= 0 or math.ceil(o * W / L) <= D then
            break
          end
          retry = retry + 1
        end
        HRETRY = retry
      else
        level = level + c
        local left = B - level
        left = left - left % 1
        if left < 0 then
          left = 0
        end
        reset = level * W / L
        f = reset - reset % 1
        if f < reset then
          reset = f + 1
        end
        OK, TREM, TRESET, TDELAY = 1, left, reset, wait
      end
    end
    if OK == 1 then
      -- The key lives as long as its state can matter: a full refill
      -- (token_bucket) or drain (leaky_bucket, gcra, whose level may
      -- exceed B by the delay), in ms. Written with its whole horizon
      -- rather than the time its state matters now, a busy client's key
      -- is overwritten, not expired and created again at every request:
      -- the difference is Redis's active expiry, which otherwise deletes
      -- a key for every request.
      local H = B * W / L
      if a ~= TOKEN_BUCKET then
        H = H + D
      end
      H = H / 1000
      if H % 1 > 0 then
        H = H - H % 1 + 1
      end
      if H < 1 then
        H = 1
      end
      WVAL, WTTL = spack('<dd', now, level), H + slack
    end
  end
  if OK == 0 and sh ~= FLAG_SHADOW then
    all = 0
  end
  if i < nrules then
    all, pos = rule(i + 1, nrules, all, pos, r0, rid, blob, V, now, slack, reply, FIRST, NEXT, hexes, level_at, rule, sunpack, spack, call, pcall, format)
  end
  -- Phase two: only if the request is admitted, write, and answer with the
  -- counts after consuming; otherwise answer with the counts as they stand.
  local ok, reason, rem, reset, retry, delay = OK, REASON_NONE, HREM, HRESET, HRETRY, 0
  if c > M then
    reason, retry = REASON_COST_TOO_HIGH, 0
  elseif ok == 0 then
    reason = REASON_LIMITED
  elseif all == 1 then
    if a ~= SLIDING_WINDOW_LOG then
      if WTTL == 0 then
        -- In place if it keeps its length (see single).
        if #WVAL ~= WLEN or pcall('SETRANGE', k, '0', WVAL) ~= WLEN then
          call('SET', k, WVAL, 'KEEPTTL')
        end
      else
        call('SET', k, WVAL, 'PX', format('%d', WTTL))
      end
    else
      -- Record the admission in the log.
      local sub, min = string.sub, math.min
      local total, rank = LTOTAL, LRANK
      if WVAL == 'replace' then
        call('DEL', k)
      end
      if WVAL ~= 'append' then
        call('ZADD', k, '-inf', '00000000000000')
      elseif total >= REBASE then
        -- Restart the totals from the kept edge entry: rewrite the
        -- window.
        local kept = call('ZRANGE', k, rank, '-1', 'WITHSCORES')
        local base = tonumber(sub(kept[1], 1, 14), 16)
        call('DEL', k)
        call('ZADD', k, '-inf', '00000000000000')
        for j = 3, #kept, 2 do
          call('ZADD', k, kept[j + 1], format('%014x', tonumber(sub(kept[j], 1, 14), 16) - base) .. sub(kept[j], 15))
        end
        total, rank = total - base, 0
      end
      call('ZADD', k, LAT, format('%014x:%x', total, rid))
      call('PEXPIRE', k, WTTL)
      if rank > 0 then
        call('ZREMRANGEBYRANK', k, '0', min(rank, SWEEP) - 1)
      end
    end
    rem, reset, delay = TREM, TRESET, TDELAY
  end
  if i == 1 then
    reply[r0 + 1] = spack(FIRST, all, ok, reason, rem, reset, retry, delay, TOKEN)
  else
    reply[r0 + i] = spack(NEXT, ok, reason, rem, reset, retry, delay, TOKEN)
  end
  return all, pos
end

-- The reply's strings, one per rule, sized for one.
local reply, r = { '' }, 0
for _ = 1, nreq do
  -- A request and its first rule, in one unpack (every request has one).
  -- A request of one rule is single's, unless it is denied and must work
  -- out its wait; rule reads the rules again from the first.
  local nrules, rid, id, sh, c, k, at = sunpack('<BdHBdHc0', blob, pos)
  local s, reset
  if nrules == 1 and not lk then
    local v = POLICY_VALUES * id
    s, reset = single(V[v + 1], V[v + 2], V[v + 3], V[v + 4], V[v + 5], V[v + 6], sh, c, k, now, slack, FIRST, not tokens_wanted, sunpack, spack, call, pcall, format, match, tonumber)
    if reset then
      s = spack('<Bdd', LEAN_REPLY, s, reset)
    end
    if s then
      r = r + 1
      reply[r], pos = s, at
    end
  end
  if not s then
    local _
    _, pos = rule(1, nrules, 1, pos + 9, r, rid, blob, V, now, slack, reply, FIRST, NEXT, hexes, level_at, rule, sunpack, spack, call, pcall, format)
    r = r + nrules
  end
end
if r == 1 then
  return reply[1]
end
return concat(reply, '', 1, r)
