import { describe, expect, it } from 'vitest';

import {
  backoffDelay,
  errorAdvice,
  errorText,
  EventStreamParser,
  formatAge,
  isolationInfo,
  meterText,
  poolSummary,
  progressText,
  readyText,
  resourceRows,
  sandboxAge,
  sandboxSpecInfo,
  sandboxState,
  secondsToIdleCull,
  startsText,
  stateLabel,
  usageRows,
  workspaceHeader
} from '../src/model';

const ready = {
  claim: 'c1',
  pool: 'default',
  sandbox: 'default-abc',
  suspended: false,
  progress: { step: 'ready', detail: 'claimed a warm sandbox' }
};

describe('sandboxState', () => {
  it('follows claiming -> ready -> busy/idle -> suspended -> resuming', () => {
    expect(sandboxState(undefined, 'starting')).toBe('claiming');
    expect(sandboxState(null, undefined)).toBe('claiming');
    expect(
      sandboxState({ claim: 'c1', progress: { step: 'claiming', detail: '' } }, 'starting')
    ).toBe('claiming');
    expect(sandboxState({ claim: 'c1', progress: { step: 'waiting', detail: '' } }, null)).toBe(
      'waiting'
    );
    expect(sandboxState(ready, 'starting')).toBe('ready');
    expect(sandboxState(ready, undefined)).toBe('ready');
    expect(sandboxState(ready, 'busy')).toBe('busy');
    expect(sandboxState(ready, 'idle')).toBe('idle');
    const suspended = { ...ready, suspended: true, progress: { step: 'suspended', detail: '' } };
    // The browser still believes the kernel idle: the sandbox's state wins.
    expect(sandboxState(suspended, 'idle')).toBe('suspended');
    expect(
      sandboxState({ ...suspended, progress: { step: 'resuming', detail: '' } }, 'restarting')
    ).toBe('resuming');
    expect(sandboxState({ ...ready, progress: { step: 'suspending', detail: '' } }, 'idle')).toBe(
      'suspending'
    );
  });

  it('reports failures and dead kernels', () => {
    expect(sandboxState({ claim: null, progress: { step: 'failed', detail: 'x' } }, 'idle')).toBe(
      'failed'
    );
    expect(sandboxState(ready, 'dead')).toBe('dead');
    expect(sandboxState(ready, 'autorestarting')).toBe('restarting');
  });

  it('has words for every state', () => {
    expect(stateLabel('claiming')).toBe('claiming…');
    expect(stateLabel('waiting')).toBe('waiting for sandbox…');
    expect(stateLabel('resuming')).toBe('resuming…');
    expect(stateLabel('suspended')).toBe('suspended');
    expect(stateLabel('idle')).toBe('idle');
  });
});

describe('isolationInfo', () => {
  it('names bubblewrap and kubernetes runtime classes without a warning', () => {
    expect(isolationInfo('bubblewrap')).toMatchObject({ label: 'bubblewrap', warning: false });
    const gvisor = isolationInfo('kubernetes', 'pod in namespace ns, runtimeClassName gvisor');
    expect(gvisor).toMatchObject({ label: 'k8s: gvisor', warning: false });
    expect(gvisor.description).toContain('runtime class gvisor');
    const plain = isolationInfo('kubernetes', 'pod in namespace ns');
    expect(plain).toMatchObject({ label: 'k8s pod', warning: false });
    expect(plain.description).toContain('default runtime');
  });

  it('warns plainly when a sandbox is not isolated or isolation is unknown', () => {
    const none = isolationInfo('none', 'bwrap not found');
    expect(none.warning).toBe(true);
    expect(none.label).toBe('not isolated');
    expect(none.description).toContain('NOT isolated');
    expect(none.description).toContain('bwrap not found');
    expect(isolationInfo(undefined).warning).toBe(true);
  });

  it('says what Landlock alone confines and warns that it is not full isolation', () => {
    const landlock = isolationInfo('landlock', 'bubblewrap (bwrap) is not installed');
    expect(landlock).toMatchObject({ label: 'Landlock only', warning: true });
    expect(landlock.description).toContain('cannot read your files');
    expect(landlock.description).toContain('bubblewrap');
  });
});

describe('errors in words', () => {
  it('gives advice per reason', () => {
    expect(errorAdvice({ reason: 'PoolNotFound' })).toContain('pool');
    expect(errorAdvice({ reason: 'QuotaExceeded' })).toContain('quota');
    expect(errorAdvice({ reason: 'Timeout' })).toContain('try again');
    expect(errorAdvice({ reason: 'BackendUnavailable' })).toContain('not reachable');
    expect(errorAdvice({ reason: 'Whatever' })).toContain('server log');
  });

  it('keeps the server hint', () => {
    expect(errorText({ message: 'pool x missing', hint: 'create it' })).toBe(
      'pool x missing (create it)'
    );
    expect(errorText({ message: 'boom', hint: '' })).toBe('boom');
    expect(errorText({})).toContain('could not be claimed');
  });
});

describe('progressText', () => {
  it('says warm, cold or waiting', () => {
    expect(progressText({ pool: 'gpu' })).toBe("Claiming a sandbox from pool 'gpu'…");
    expect(
      progressText({
        pool: 'gpu',
        sandbox: { claim: 'c', warm: false, progress: { step: 'waiting', detail: '' } }
      })
    ).toContain('cold start');
    expect(
      progressText({
        sandbox: { claim: 'c', pool: 'p', progress: { step: 'waiting', detail: 'x' } }
      })
    ).toBe("Pool 'p': waiting for the pool (x)…");
    expect(
      progressText({
        pool: 'p',
        sandbox: { claim: 'c', warm: true, progress: { step: 'ready', detail: '' } }
      })
    ).toContain('claimed a warm sandbox');
  });
});

describe('formatting', () => {
  it('formats ages', () => {
    expect(formatAge(5.7)).toBe('5 s');
    expect(formatAge(125)).toBe('2 min');
    expect(formatAge(3600)).toBe('1 h');
    expect(formatAge(3600 + 600)).toBe('1 h 10 min');
    expect(formatAge(86400 * 2 + 3600 * 3)).toBe('2 d 3 h');
    expect(formatAge(-1)).toBe('–');
    expect(sandboxAge(1000, 1_061_000)).toBe('1 min');
    expect(sandboxAge(null)).toBe('–');
  });

  it('summarises pools', () => {
    const pool = {
      name: 'p',
      namespace: 'n',
      replicas: 3,
      ready: 2,
      starting: 1,
      claimed: 4,
      isolation: 'none',
      display_name: ''
    };
    expect(poolSummary(pool)).toBe('2/3 warm, 1 starting, 4 in use');
    expect(poolSummary({ ...pool, starting: 0, claimed: 0 })).toBe('2/3 warm');
  });

  it('backs off up to 30 s', () => {
    expect(backoffDelay(0)).toBe(1000);
    expect(backoffDelay(3)).toBe(8000);
    expect(backoffDelay(20)).toBe(30000);
  });
});

describe('sandboxSpecInfo', () => {
  it('recognises sandbox kernelspecs', () => {
    expect(
      sandboxSpecInfo({ metadata: { jupyter_sandbox: { pool: 'p', backend: 'kubernetes' } } })
    ).toEqual({ pool: 'p', backend: 'kubernetes' });
    expect(
      sandboxSpecInfo({
        metadata: {
          kernel_provisioner: { provisioner_name: 'sandbox-provisioner', config: { pool: 'q' } }
        }
      })
    ).toEqual({ pool: 'q', backend: 'local' });
    expect(sandboxSpecInfo({ metadata: {} })).toBeNull();
    expect(sandboxSpecInfo(undefined)).toBeNull();
  });
});

describe('EventStreamParser', () => {
  it('parses events split across chunks, with comments and CRLF', () => {
    const parser = new EventStreamParser();
    expect(parser.feed(': connected\n\n')).toEqual([]);
    expect(parser.feed('event: snap')).toEqual([]);
    expect(parser.feed('shot\ndata: {"a":')).toEqual([]);
    expect(parser.feed('1}\n\n')).toEqual([{ event: 'snapshot', data: '{"a":1}' }]);
    expect(parser.feed('data: one\r\ndata: two\r\n\r\n: keep-alive\n\n')).toEqual([
      { event: 'message', data: 'one\ntwo' }
    ]);
    expect(parser.feed('id: 7\nevent: x\ndata:y\r')).toEqual([]);
    expect(parser.feed('\n\n')).toEqual([{ event: 'x', data: 'y', id: '7' }]);
  });
});

describe('resourceRows', () => {
  it('says local resources in words, hiding bookkeeping', () => {
    const rows = resourceRows({
      pid: 4242,
      network: false,
      memory_mb: 2048,
      cpu_seconds: null,
      restarts: 1,
      owner_pid: 77,
      files_dir: '/home/ana/project',
      files_read_only: true
    });
    expect(rows).toEqual([
      ['Process', 'pid 4242'],
      ['Network', 'none'],
      ['Memory limit', '2048 MB'],
      ['CPU time limit', 'none'],
      ['Restarts', '1'],
      ['Notebook files', '/home/ana/project (read-only)']
    ]);
  });

  it('says where the project keeps its %pip packages, and how to put them in a pool', () => {
    expect(resourceRows({ packages_dir: '/state/projects/ab12' })).toEqual([
      [
        '%pip packages',
        'kept for this project in /state/projects/ab12 (to give every sandbox of a pool ' +
          'a package: jupyter-sandbox pool create NAME --requirements FILE)'
      ]
    ]);
    expect(resourceRows({ packages_dir: null })).toEqual([]);
  });

  it('says the workspace disk use, whether the limit is enforced, and when it is reached', () => {
    expect(resourceRows({ disk: { limit_mb: 10240, used_mb: 12.5, over: false } })).toEqual([
      ['Workspace disk', '12.5 MB of 10240 MB']
    ]);
    expect(resourceRows({ disk: { limit_mb: 5, used_mb: 8, over: true } })).toEqual([
      ['Workspace disk', '8 MB of 5 MB (over the limit)']
    ]);
    expect(resourceRows({ disk: { limit_mb: 5, used_mb: 4.6, over: true, enforced: true } })).toEqual([
      ['Workspace disk', '4.6 MB of 5 MB, enforced (full)']
    ]);
    expect(resourceRows({ disk: { limit_mb: 64, used_mb: 3, over: false, enforced: true } })).toEqual([
      ['Workspace disk', '3 MB of 64 MB, enforced']
    ]);
    expect(resourceRows({ disk: { limit_mb: null, used_mb: null, over: false } })).toEqual([
      ['Workspace disk', 'not measured yet (no limit)']
    ]);
    expect(resourceRows({ disk: null })).toEqual([]);
  });

  it('says Kubernetes resources in words and leaves out empty ones', () => {
    const rows = resourceRows({
      pod: 'sb-1',
      node: null,
      podIPs: ['10.0.0.5', 'fd00::5'],
      runtimeClassName: 'gvisor',
      someNewField: 'x'
    });
    expect(rows).toEqual([
      ['Pod', 'sb-1'],
      ['Pod IPs', '10.0.0.5, fd00::5'],
      ['Runtime class', 'gvisor'],
      ['Some new field', 'x']
    ]);
  });

  it('never shows a raw key', () => {
    const keys = ['pid', 'memory_mb', 'cpu_seconds', 'files_dir', 'serviceFQDN', 'operatingMode'];
    for (const key of keys) {
      const [[label]] = resourceRows({ [key]: 'v' });
      expect(label).not.toContain('_');
      expect(label).not.toBe(key);
    }
  });
});

describe('usageRows', () => {
  const usage = { memory_in_use_mb: 135.6, cpu_percent: 2.96, cpu_seconds_used: 12.345, processes: 3 };
  it.each([
    [
      'running',
      usage,
      false,
      [
        ['Memory in use', '136 MB'],
        ['CPU now', '3% of a core'],
        ['CPU used', '12.3 s'],
        ['Processes', '3']
      ]
    ],
    ['suspended', null, true, [['In use', 'nothing (suspended)']]],
    ['suspended, stale reading', usage, true, [['In use', 'nothing (suspended)']]],
    ['unreadable', null, false, []],
    ['not asked', undefined, false, []],
    [
      'no process count',
      { ...usage, processes: 0 },
      false,
      [
        ['Memory in use', '136 MB'],
        ['CPU now', '3% of a core'],
        ['CPU used', '12.3 s']
      ]
    ]
  ])('%s', (_name, reading, suspended, expected) => {
    expect(usageRows(reading, suspended)).toEqual(expected);
  });
});

describe('secondsToIdleCull', () => {
  const now = Date.parse('2026-12-07T12:00:00Z');
  const culling = { idle_timeout: 3600, interval: 300, connected: true, busy: false, suspends: true };
  const idleFor = (seconds: number, extra = {}) => ({
    last_activity: new Date(now - seconds * 1000).toISOString(),
    execution_state: 'idle',
    connections: 1,
    ...extra
  });
  it.each([
    ['long before the cull: nothing', idleFor(60), culling, null],
    ['five minutes before: the seconds left', idleFor(3300), culling, 300],
    ['two minutes before', idleFor(3480), culling, 120],
    ['overdue (the culler checks every interval): 0', idleFor(3700), culling, 0],
    ['culling off', idleFor(3500), { ...culling, idle_timeout: 0 }, null],
    ['busy and busy kernels are not culled', idleFor(3500, { execution_state: 'busy' }), culling, null],
    ['busy, but the server culls busy kernels too', idleFor(3500, { execution_state: 'busy' }), { ...culling, busy: true }, 100],
    ['a tab open and connected kernels are spared', idleFor(3500), { ...culling, connected: false }, null],
    ['no tab open, connected kernels spared', idleFor(3500, { connections: 0 }), { ...culling, connected: false }, 100],
    ['a short timeout: notice at a quarter of it', idleFor(32), { ...culling, idle_timeout: 40 }, 8],
    ['a short timeout, not yet', idleFor(20), { ...culling, idle_timeout: 40 }, null],
    ['no settings from the server', idleFor(3500), undefined, null],
    ['an unreadable time', { ...idleFor(0), last_activity: 'soon' }, culling, null]
  ])('%s', (_, kernel, settings, expected) => {
    expect(secondsToIdleCull(kernel, settings, now)).toBe(expected);
  });
});

describe('meterText', () => {
  const usage = (memory: number, cpu: number) => ({
    memory_in_use_mb: memory,
    cpu_percent: cpu,
    cpu_seconds_used: 1,
    processes: 3
  });
  it.each([
    ['nothing known', null, null],
    ['suspended (no usage)', undefined, null],
    ['megabytes', usage(312.4, 3.6), '312 MB · 4% CPU'],
    ['gigabytes above 1024 MB', usage(1536, 100), '1.5 GB · 100% CPU'],
    ['several cores', usage(80, 250.2), '80 MB · 250% CPU']
  ])('%s', (_, given, expected) => {
    expect(meterText(given)).toBe(expected);
  });
});

describe('one toast for many starts', () => {
  const start = (n: number) => ({ key: `k${n}`, display: `Python ${n}`, progress: 'cold start' });
  it.each([
    ['one start: as before', [start(1)], 'Python 1: cold start'],
    [
      'two at once: one toast',
      [start(1), start(2)],
      'Starting 2 sandboxed kernels. Python 1: cold start; Python 2: cold start'
    ],
    [
      'five: three named and the count',
      [1, 2, 3, 4, 5].map(start),
      'Starting 5 sandboxed kernels. Python 1: cold start; Python 2: cold start; ' +
        'Python 3: cold start (and 2 more)'
    ]
  ])('%s', (_, live, expected) => {
    expect(startsText(live)).toBe(expected);
  });
  it.each([
    ['one warm', [{ sandbox: 'default-a', warm: true }], 'Sandbox default-a ready (claimed warm).'],
    ['one cold', [{ sandbox: 'default-b', warm: false }], 'Sandbox default-b ready (cold start).'],
    [
      'several: counted',
      [
        { sandbox: 'a', warm: true },
        { sandbox: 'b', warm: false },
        { sandbox: 'c', warm: true }
      ],
      '3 sandboxes ready (2 claimed warm, 1 cold start).'
    ],
    [
      'several, all warm',
      [
        { sandbox: 'a', warm: true },
        { sandbox: 'b', warm: true }
      ],
      '2 sandboxes ready (2 claimed warm).'
    ]
  ])('%s', (_, ready, expected) => {
    expect(readyText(ready)).toBe(expected);
  });
});

describe('workspaceHeader', () => {
  it.each([
    ['nothing in focus', null, undefined, 'Open a sandboxed notebook'],
    ['a bound directory', 'a.ipynb', { claim: 'c', resources: { files_dir: '/home/u/p' } }, 'is bound into the sandbox'],
    ['copy mode', 'a.ipynb', { claim: 'c', files: { mode: 'copy', dir: '/p' } }, 'copied in here'],
    ['no notebook directory', 'Console 1', { claim: 'c', resources: {} }, 'Workspace of the sandbox of Console 1']
  ])('%s', (_, label, sandbox, expected) => {
    expect(workspaceHeader(label as any, sandbox as any)).toContain(expected);
  });
});
