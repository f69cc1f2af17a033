#!lua
-- decide.lua decides a batch of requests in one call. Each request is
-- decided all or nothing, in order: if any of its rules denies, none of its
-- rules consumes anything, and a later request of the batch sees what an
-- earlier one consumed. It is algo/eval.go and algo/log.go in Lua, step for
-- step and in the same order of floating-point operations; the differential
-- test in package algo holds the two to identical answers.
--
-- KEYS: none with a standalone or Sentinel client (the keys are in ARGV[1]);
--       in Redis Cluster, every key of the batch, all of one hash slot, so
--       the cluster routes the call and checks the slot. The script reads
--       its keys from ARGV[1] either way.
-- ARGV[1]: the batch, little-endian binary (struct formats in brackets):
--   header   [d] the time in µs since 2020-01-01T00:00:00Z, or -1 to read
--                Redis TIME (production always reads TIME, so replicas with
--                skewed clocks agree; only tests pin the time)
--            [H] the number of requests, [H] the number of policies,
--            [B] flags: 1 = reply with a refund token per rule
--   policies per policy: [H] id, [B] algorithm (1 fixed_window,
--            2 sliding_window_log, 3 sliding_window_counter, 4 token_bucket,
--            5 leaky_bucket, 6 gcra), [d] limit, [d] window (µs),
--            [d] burst, [d] delay (µs), [d] max cost (the largest cost the
--            policy ever admits)
--   requests per request: [B] the number of rules, [d] the request's id
--            (unique to the caller, below 2^52), then per rule: [H] the
--            policy id, [B] shadow (1: its denial does not deny),
--            [d] cost, [H] key length and the key
-- Reply: an array of integers: per request, admitted (1 or 0), then per
--   rule allowed (1 or 0), reason (0 none, 1 limited, 2 cost too high),
--   remaining, reset after (µs), retry after (µs), delay (µs), and with
--   flag 1 a refund token for refund.lua: the window index written
--   (fixed_window, sliding_window_counter), the entry's time
--   (sliding_window_log), 0 for the others. An admitted request's allowing
--   rules answer with their counts after consuming; otherwise every rule
--   answers with the counts that stand.
--
-- State, by algorithm, each in one key that expires when its state no longer
-- matters (hex integers are written with %x, which keeps the keys redis
-- holds most of small):
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
-- call before anything is written. The script makes as little garbage as it can (one table of
-- results, one reply), since Redis pays for Lua's garbage collection in
-- every call.

local sunpack, spack = struct.unpack, struct.pack
local sub, format, find = string.sub, string.format, string.find
local floor, ceil, min, max, fmod = math.floor, math.ceil, math.min, math.max, math.fmod
local call, pcall = redis.call, redis.pcall

local EPOCH = 1577836800000000 -- 2020-01-01T00:00:00Z in Unix µs
local REBASE = 4503599627370496 -- 2^52: a log's totals restart below this
local SWEEP = 64 -- left-behind log entries removed per admission, at most
local RETRY_STEPS = 4

local blob = ARGV[1]
local now, nreq, npol, flags, pos = sunpack('<dHHB', blob)
local slack = 0
if now < 0 then
  local t = call('TIME')
  now = max(tonumber(t[1]) * 1000000 + tonumber(t[2]) - EPOCH, 0)
else
  -- A pinned clock runs apart from Redis's own, which expires keys: give
  -- tests an hour of slack so a key never expires under a test's feet.
  slack = 3600000
end
local tokens_wanted = flags % 2 == 1

-- Policies, 7 values each from P[8 * id].
local P = {}
for _ = 1, npol do
  local id, a, L, W, B, D, M
  id, a, L, W, B, D, M, pos = sunpack('<HBddddd', blob, pos)
  local b = 8 * id
  P[b], P[b + 1], P[b + 2], P[b + 3], P[b + 4], P[b + 5] = a, L, W, B, D, M
end

-- R holds one request's rules, 17 values each from R[17 * i]: what the rule
-- answers, and what it writes if the request is admitted.
local KEY, ALG, COST, CAP, OK, HREM, HRESET, HRETRY, TREM, TRESET, TDELAY, WVAL, WTTL, TOKEN, LAT, LRANK, LTOTAL =
  0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
local R = {}

-- hexes reads "a:b" or "a:b:c" (c = 0 for the first); nil if v is not one.
-- It is the script's only function: every closure a call makes costs Redis
-- an allocation and its collection, so the rest is written inline, and the
-- few helpers a denial needs are made only when one does.
local function hexes(v)
  if type(v) ~= 'string' then
    if type(v) == 'table' and v.err and not find(v.err, 'WRONGTYPE', 1, true) then
      error(v) -- not a wrong type: the key cannot be read (an ACL, say)
    end
    return nil
  end
  local i = find(v, ':', 1, true)
  if not i then
    return nil
  end
  local j = find(v, ':', i + 1, true)
  local a, b, c
  if j then
    a, b, c = tonumber(sub(v, 1, i - 1), 16), tonumber(sub(v, i + 1, j - 1), 16), tonumber(sub(v, j + 1), 16)
  else
    a, b, c = tonumber(sub(v, 1, i - 1), 16), tonumber(sub(v, i + 1), 16), 0
  end
  if a and b and c then
    return a, b, c
  end
  return nil
end

local reply, r = {}, 0
for _ = 1, nreq do
  local nrules, rid
  nrules, rid, pos = sunpack('<Bd', blob, pos)
  local all = 1
  -- Phase one: every rule decides without writing. A key expires (ttl, in
  -- ms) when its state no longer matters; a pinned clock adds slack.
  for i = 1, nrules do
    local b = 17 * i
    local id, sh, c, k
    id, sh, c, k, pos = sunpack('<HBdHc0', blob, pos)
    local p = 8 * id
    local a, L, W, B, D, M = P[p], P[p + 1], P[p + 2], P[p + 3], P[p + 4], P[p + 5]
    R[b + KEY], R[b + COST], R[b + ALG], R[b + CAP] = k, c, a, M
    R[b + OK], R[b + HREM], R[b + HRESET], R[b + HRETRY], R[b + TDELAY], R[b + TOKEN] = 0, 0, 0, 0, 0, 0
    if a == 1 then -- fixed_window
      local idx, n = (now - fmod(now, W)) / W, 0
      local w, cnt = hexes(pcall('GET', k))
      if w and w >= idx then
        -- A later window than now's: the clock stepped back.
        idx, n = w, cnt
      end
      local ending = (idx + 1) * W - now
      R[b + HREM] = L - n
      if n > 0 then
        R[b + HRESET] = ending
      end
      if c > M or n + c > L then
        R[b + HRETRY] = ending
      else
        R[b + OK], R[b + TREM], R[b + TRESET] = 1, L - n - c, ending
        R[b + WVAL], R[b + WTTL], R[b + TOKEN] = format('%x:%x', idx, n + c), max(ceil(ending / 1000), 1) + slack, idx
      end
    elseif a == 3 then -- sliding_window_counter
      local w, n, pv = hexes(pcall('GET', k))
      local idx, cur, prev = (now - fmod(now, W)) / W, 0, 0
      if w then
        if w >= idx then
          idx, cur, prev = w, n, pv
        elseif w == idx - 1 then
          prev = n
        end
      end
      local e = max(now - idx * W, 0) -- elapsed in the current window
      local est = prev * (W - e) / W + cur
      R[b + HREM] = max(floor(L - est), 0)
      if cur > 0 then
        R[b + HRESET] = 2 * W - e
      elseif prev > 0 then
        R[b + HRESET] = W - e
      end
      if c > M then
        -- denied: cost too high
      elseif est + c <= L then
        R[b + OK], R[b + TREM], R[b + TRESET] = 1, max(floor(L - est - c), 0), 2 * W - e
        R[b + WVAL], R[b + WTTL], R[b + TOKEN] = format('%x:%x:%x', idx, cur + c, prev), max(ceil((2 * W - e) / 1000), 1) + slack, idx
      else
        local wait
        if cur + c <= L then
          -- Only the previous window's weight must shrink.
          wait = max(ceil(W - (L - cur - c) * W / prev - e), 1)
        else
          -- Wait into the next window, where this window's count is the
          -- previous.
          wait = W - e + max(ceil(W - (L - c) * W / cur), 0)
        end
        -- Check the wait against the state as it stands.
        local function admits(at)
          local ix, cu, pr = (at - fmod(at, W)) / W, 0, 0
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
        R[b + HRETRY] = wait
      end
    elseif a == 2 then -- sliding_window_log
      local newest = pcall('ZRANGE', k, -1, -1, 'WITHSCORES')
      local total, before, rank, card = 0, 0, -1, 0
      local at = now
      R[b + WVAL] = 'fresh'
      if type(newest) ~= 'table' or newest.err then
        hexes(newest) -- raises if the key cannot be read
        R[b + WVAL] = 'replace' -- a key of another type
      elseif #newest > 0 then
        R[b + WVAL] = 'append'
        total = tonumber(sub(newest[1], 1, 14), 16)
        local ts = tonumber(newest[2])
        at = max(now, ts)
        -- The entry at or before the edge with the greatest time: the
        -- window holds what came after it.
        local edge = call('ZRANGE', k, now - W, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
        before = tonumber(sub(edge[1], 1, 14), 16)
        rank = call('ZRANK', k, edge[1])
        card = call('ZCARD', k)
        if total - before > 0 then
          R[b + HRESET] = ts + W - now
        end
      end
      local n = total - before
      R[b + HREM] = L - n
      if c > M then
        -- denied: cost too high
      elseif n + c > L then
        -- The oldest entries must leave until the request fits: find the
        -- first whose total frees enough, by binary search on rank.
        local want = before + n + c - L
        local lo, hi = rank + 1, card - 1
        while lo < hi do
          local mid = floor((lo + hi) / 2)
          if tonumber(sub(call('ZRANGE', k, mid, mid)[1], 1, 14), 16) >= want then
            hi = mid
          else
            lo = mid + 1
          end
        end
        R[b + HRETRY] = tonumber(call('ZRANGE', k, lo, lo, 'WITHSCORES')[2]) + W - now
      else
        R[b + OK], R[b + TREM], R[b + TRESET] = 1, L - n - c, at + W - now
        R[b + LAT], R[b + LRANK], R[b + WTTL], R[b + TOKEN] = at, rank, max(ceil((at + W - now) / 1000), 1) + slack, at
        R[b + LTOTAL] = total + c
      end
    else -- token_bucket (4); leaky_bucket (5) and gcra (6), which is one with it
      local t, x
      local v = pcall('GET', k)
      if type(v) == 'string' and #v == 16 then
        t, x = sunpack('<dd', v)
      else
        hexes(v) -- raises if the key cannot be read
      end
      -- A token bucket holds tokens refilling up to B; a leaky bucket a
      -- level draining to 0.
      local function level_at(at)
        if a == 4 then
          if not t then
            return B
          end
          return min(B, x + max(at - t, 0) * L / W)
        end
        if not t then
          return 0
        end
        return max(0, x - max(at - t, 0) * L / W)
      end
      local level = level_at(now)
      if a == 4 then
        R[b + HREM] = floor(level)
        R[b + HRESET] = ceil((B - level) * W / L)
      else
        R[b + HREM] = max(floor(B - level), 0)
        R[b + HRESET] = ceil(level * W / L)
      end
      if c > M then
        -- denied: cost too high
      elseif a == 4 then
        if level < c then
          local wait = ceil((c - level) * W / L)
          for _ = 1, RETRY_STEPS do
            if level_at(now + wait) >= c then
              break
            end
            wait = wait + 1
          end
          R[b + HRETRY] = wait
        else
          level = level - c
          R[b + OK], R[b + TREM], R[b + TRESET] = 1, floor(level), ceil((B - level) * W / L)
        end
      else
        -- The request waits until enough has drained for it to fit.
        local over, wait = level + c - B, 0
        if over > 0 then
          wait = ceil(over * W / L)
        end
        if wait > D then
          local retry = wait - D
          for _ = 1, RETRY_STEPS do
            local o = level_at(now + retry) + c - B
            if o <= 0 or ceil(o * W / L) <= D then
              break
            end
            retry = retry + 1
          end
          R[b + HRETRY] = retry
        else
          level = level + c
          R[b + OK], R[b + TREM], R[b + TRESET], R[b + TDELAY] = 1, max(floor(B - level), 0), ceil(level * W / L), wait
        end
      end
      if R[b + OK] == 1 then
        R[b + WVAL], R[b + WTTL] = spack('<dd', now, level), max(ceil(R[b + TRESET] / 1000), 1) + slack
      end
    end
    if R[b + OK] == 0 and sh ~= 1 then
      all = 0
    end
  end
  -- Phase two: only if the request is admitted, write, and answer with the
  -- counts after consuming; otherwise answer with the counts as they stand.
  r = r + 1
  reply[r] = all
  for i = 1, nrules do
    local b = 17 * i
    local ok, reason, rem, reset, retry, delay = R[b + OK], 0, R[b + HREM], R[b + HRESET], R[b + HRETRY], 0
    if R[b + COST] > R[b + CAP] then
      reason, retry = 2, 0
    elseif ok == 0 then
      reason = 1
    elseif all == 1 then
      local k = R[b + KEY]
      if R[b + ALG] ~= 2 then
        call('SET', k, R[b + WVAL], 'PX', R[b + WTTL])
      else
        -- Record the admission in the log.
        local total, rank = R[b + LTOTAL], R[b + LRANK]
        if R[b + WVAL] == 'replace' then
          call('DEL', k)
        end
        if R[b + WVAL] ~= 'append' then
          call('ZADD', k, '-inf', '00000000000000')
        elseif total >= REBASE then
          -- Restart the totals from the kept edge entry: rewrite the
          -- window.
          local kept = call('ZRANGE', k, rank, -1, 'WITHSCORES')
          local base = tonumber(sub(kept[1], 1, 14), 16)
          call('DEL', k)
          call('ZADD', k, '-inf', '00000000000000')
          for j = 3, #kept, 2 do
            call('ZADD', k, kept[j + 1], format('%014x', tonumber(sub(kept[j], 1, 14), 16) - base) .. sub(kept[j], 15))
          end
          total, rank = total - base, 0
        end
        call('ZADD', k, R[b + LAT], format('%014x:%x', total, rid))
        call('PEXPIRE', k, R[b + WTTL])
        if rank > 0 then
          call('ZREMRANGEBYRANK', k, 0, min(rank, SWEEP) - 1)
        end
      end
      rem, reset, delay = R[b + TREM], R[b + TRESET], R[b + TDELAY]
    end
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] = ok, reason, rem, reset, retry, delay
    r = r + 6
    if tokens_wanted then
      r = r + 1
      reply[r] = R[b + TOKEN]
    end
  end
end
return reply
