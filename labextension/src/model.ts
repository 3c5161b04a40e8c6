/**
 * Pure logic of the sandbox UI: types of the server's answers, the state shown
 * to the user, isolation wording, error advice, formatting, and a parser for
 * the server-sent event stream. No JupyterLab imports: unit-tested on its own.
 */

export interface IProgress {
  step: string;
  detail: string;
  since?: number;
}

/** `SandboxProvisioner.describe()` as the server extension reports it. */
export interface ISandboxDescription {
  claim: string | null;
  pool?: string;
  sandbox?: string | null;
  namespace?: string | null;
  isolation?: string | null;
  isolation_detail?: string | null;
  workspace?: string | null;
  warm?: boolean | null;
  progress?: IProgress;
  suspended?: boolean;
  connected?: boolean;
  kernel?: Record<string, unknown>;
  created?: number | null;
  resources?: Record<string, unknown>;
  /** What the backend says of the claim now (e.g. a workspace over its disk limit). */
  message?: string | null;
  /** Copy mode only: the notebook's directory copied in, and the last copy back. */
  files?: ICopiedFiles | null;
}

export interface ICopiedFiles {
  mode: 'copy';
  dir: string;
  copied_in: string | null;
  last: {
    direction: 'in' | 'back';
    at: number;
    conflicts: { path: string; written_as: string }[];
  } | null;
  last_summary: string | null;
}

/** What the sandbox's processes use now (the runtime's `GET /api/usage`). */
export interface IUsage {
  memory_in_use_mb: number;
  cpu_percent: number;
  cpu_seconds_used: number;
  processes: number;
}

export interface IKernelEntry {
  id: string;
  name: string;
  execution_state: string | null;
  backend: string;
  sandbox: ISandboxDescription;
  claim_status?: Record<string, unknown> | null;
  /** Only in a fresh read of one kernel; null while nothing runs (suspended). */
  usage?: IUsage | null;
}

export interface IStartError {
  reason: string;
  message: string;
  hint: string;
}

export interface IStartingEntry {
  id: string | null;
  name: string;
  state: 'starting' | 'failed';
  pool?: string;
  backend?: string;
  sandbox?: ISandboxDescription;
  error?: IStartError;
  at?: number;
}

export interface IPoolEntry {
  name: string;
  namespace: string;
  replicas: number;
  ready: number;
  starting: number;
  claimed: number;
  isolation: string;
  display_name: string;
  backend?: string;
}

export interface ISnapshot {
  kernels: IKernelEntry[];
  starting: IStartingEntry[];
  pools: IPoolEntry[];
  daemon: { running: boolean; message: string };
  /** Present when a kernelspec uses the Kubernetes backend. */
  kubernetes?: { ok: boolean; message: string };
  /** When the server culls idle kernels (0: never). */
  culling?: ICulling;
}

/** jupyter_server's culling settings, as the server applies them. */
export interface ICulling {
  idle_timeout: number;
  interval: number;
  connected: boolean;
  busy: boolean;
  /** true: a culled sandbox is suspended (files and variables kept); false: shut down */
  suspends: boolean;
}

/** What jupyter_server's /api/kernels says of a kernel's activity. */
export interface IKernelActivity {
  last_activity: string;
  execution_state: string;
  connections: number;
}

/** A kernel whose sandbox is being claimed, as its progress toast says. */
export interface IStartingKernel {
  key: string;
  display: string;
  progress: string;
}

/** A kernel whose sandbox became ready. */
export interface IReadyKernel {
  sandbox: string;
  warm: boolean;
}

/** The one progress toast for every start under way. */
export function startsText(live: IStartingKernel[]): string {
  if (live.length === 1) {
    return `${live[0].display}: ${live[0].progress}`;
  }
  const shown = live.slice(0, 3).map(k => `${k.display}: ${k.progress}`);
  const more = live.length > 3 ? ` (and ${live.length - 3} more)` : '';
  return `Starting ${live.length} sandboxed kernels. ${shown.join('; ')}${more}`;
}

/** The one outcome toast once every start under way is done. */
export function readyText(ready: IReadyKernel[]): string {
  const how = (warm: boolean) => (warm ? 'claimed warm' : 'cold start');
  if (ready.length === 1) {
    return `Sandbox ${ready[0].sandbox} ready (${how(ready[0].warm)}).`;
  }
  const warm = ready.filter(k => k.warm).length;
  const cold = ready.length - warm;
  const parts = [warm ? `${warm} claimed warm` : '', cold ? `${cold} cold start` : ''];
  return `${ready.length} sandboxes ready (${parts.filter(Boolean).join(', ')}).`;
}

/** The status bar's meter: memory and CPU of the sandbox now, short. */
export function meterText(usage: IUsage | null | undefined): string | null {
  if (!usage) {
    return null;
  }
  const memory =
    usage.memory_in_use_mb >= 1024
      ? `${(usage.memory_in_use_mb / 1024).toFixed(1)} GB`
      : `${Math.round(usage.memory_in_use_mb)} MB`;
  return `${memory} · ${Math.round(usage.cpu_percent)}% CPU`;
}

/** Notice comes this long before an idle cull (or a quarter of the timeout). */
export const IDLE_NOTICE_SECONDS = 300;

/**
 * Seconds until the culler may take this kernel for idle, when that is soon
 * enough to say so; null when it is not (never culled, busy, not soon).
 */
export function secondsToIdleCull(
  kernel: IKernelActivity,
  culling: ICulling | undefined,
  now: number
): number | null {
  if (!culling || culling.idle_timeout <= 0) {
    return null;
  }
  if (kernel.execution_state === 'busy' && !culling.busy) {
    return null;
  }
  if (kernel.connections > 0 && !culling.connected) {
    return null;
  }
  const last = Date.parse(kernel.last_activity);
  if (Number.isNaN(last)) {
    return null;
  }
  const left = culling.idle_timeout - (now - last) / 1000;
  const notice = Math.min(IDLE_NOTICE_SECONDS, culling.idle_timeout / 4);
  return left <= notice ? Math.max(0, Math.round(left)) : null;
}

export const EMPTY_SNAPSHOT: ISnapshot = {
  kernels: [],
  starting: [],
  pools: [],
  daemon: { running: false, message: 'not connected yet' }
};

/** The states a user sees, in the order a sandbox goes through them. */
export type SandboxState =
  | 'claiming'
  | 'waiting'
  | 'ready'
  | 'busy'
  | 'idle'
  | 'suspending'
  | 'suspended'
  | 'resuming'
  | 'restarting'
  | 'failed'
  | 'dead'
  | 'unknown';

/**
 * Combine the server's view of the sandbox with the browser's view of the kernel.
 *
 * The sandbox's own steps (claiming, waiting for the pool, suspending,
 * suspended, resuming, failed) win; once it is ready, the kernel's execution
 * state (busy/idle) tells the rest.
 */
export function sandboxState(
  sandbox: ISandboxDescription | null | undefined,
  kernelStatus: string | null | undefined
): SandboxState {
  const step = sandbox?.progress?.step;
  if (step === 'failed') {
    return 'failed';
  }
  if (step === 'resuming') {
    return 'resuming';
  }
  if (step === 'suspending') {
    return 'suspending';
  }
  if (sandbox?.suspended || step === 'suspended') {
    return 'suspended';
  }
  if (step === 'claiming') {
    return 'claiming';
  }
  if (step === 'waiting') {
    return 'waiting';
  }
  switch (kernelStatus) {
    case 'busy':
      return 'busy';
    case 'idle':
      return 'idle';
    case 'restarting':
    case 'autorestarting':
      return 'restarting';
    case 'dead':
      return 'dead';
    case 'starting':
    case 'initializing':
      return sandbox?.claim ? 'ready' : 'claiming';
    default:
      break;
  }
  if (step === 'ready') {
    return 'ready';
  }
  return sandbox ? 'unknown' : 'claiming';
}

/** Words for a state, as the status bar shows them. */
export function stateLabel(state: SandboxState): string {
  switch (state) {
    case 'claiming':
      return 'claiming…';
    case 'waiting':
      return 'waiting for sandbox…';
    case 'suspending':
      return 'suspending…';
    case 'resuming':
      return 'resuming…';
    case 'restarting':
      return 'restarting…';
    default:
      return state;
  }
}

export interface IIsolation {
  /** Short words for the status bar. */
  label: string;
  /** True when the sandbox is NOT isolated from the server's user. */
  warning: boolean;
  /** A sentence for tooltips and the details dialog. */
  description: string;
}

/** Say how a sandbox is isolated, and warn plainly when it is not. */
export function isolationInfo(
  isolation: string | null | undefined,
  detail?: string | null
): IIsolation {
  const extra = detail ? ` (${detail})` : '';
  switch ((isolation ?? '').toLowerCase()) {
    case 'bubblewrap':
      return {
        label: 'bubblewrap',
        warning: false,
        description: `Isolated with bubblewrap (Linux namespaces)${extra}.`
      };
    case 'kubernetes':
    case 'runtimeclass': {
      // The Kubernetes backend says e.g. "pod in namespace ns, runtimeClassName gvisor".
      const runtime = /runtimeClassName[ =:]+([\w.-]+)/.exec(detail ?? '')?.[1];
      return {
        label: runtime ? `k8s: ${runtime}` : 'k8s pod',
        warning: false,
        description:
          `Runs in its own Kubernetes pod (${runtime ? `runtime class ${runtime}` : 'default runtime'})` +
          `${extra}.`
      };
    }
    case 'landlock':
      return {
        label: 'Landlock only',
        warning: true,
        description:
          'Confined by Landlock only (bubblewrap is missing on the server): this kernel ' +
          'cannot read your files outside its own directories, but it has no namespaces ' +
          `of its own and shares the server's network and /tmp${extra}. ` +
          'Ask for bubblewrap to be installed for full isolation.'
      };
    case 'none':
      return {
        label: 'not isolated',
        warning: true,
        description:
          'NOT isolated: code in this kernel runs as your own user on the server' +
          `${extra}. Do not run untrusted code here.`
      };
    default:
      return {
        label: 'isolation unknown',
        warning: true,
        description: 'The isolation of this sandbox is not known yet.'
      };
  }
}

/** What to tell the user about a failed claim, and what they can do about it. */
export function errorAdvice(error: Partial<IStartError>): string {
  switch (error.reason) {
    case 'PoolNotFound':
      return (
        'This kernel asks for a sandbox pool that does not exist. Create the pool ' +
        '(see the message) or pick another sandboxed kernel.'
      );
    case 'QuotaExceeded':
      return (
        'You have reached your sandbox quota. Shut down a kernel you no longer ' +
        'need (Sandboxes panel), then try again.'
      );
    case 'Timeout':
      return (
        'No sandbox became ready in time. The pool may be empty or still warming ' +
        'up: try again in a minute, or ask for a larger pool.'
      );
    case 'BackendUnavailable':
      return (
        'The sandbox service is not reachable. Check that it runs (jupyter-sandbox ' +
        'daemon for local sandboxes, the cluster otherwise).'
      );
    case 'Invalid':
      return 'The kernel specification is not valid for sandboxes: check its configuration.';
    default:
      return 'Starting the sandbox failed. The server log has the details.';
  }
}

/** The message plus its hint, when the server gave one. */
export function errorText(error: Partial<IStartError>): string {
  const message = error.message || 'the sandbox could not be claimed';
  return error.hint ? `${message} (${error.hint})` : message;
}

/** What is happening while a kernel starts, in words. */
export function progressText(entry: Pick<IStartingEntry, 'pool' | 'sandbox'>): string {
  const pool = entry.pool ?? entry.sandbox?.pool ?? '?';
  const step = entry.sandbox?.progress?.step;
  const detail = entry.sandbox?.progress?.detail;
  const warm = entry.sandbox?.warm;
  if (step === 'waiting') {
    const how =
      warm === false ? 'cold start: the pool had no warm sandbox' : 'waiting for the pool';
    return `Pool '${pool}': ${how}${detail ? ` (${detail})` : ''}…`;
  }
  if (step === 'ready') {
    return `Pool '${pool}': ${warm ? 'claimed a warm sandbox' : 'cold start done'}, connecting…`;
  }
  return `Claiming a sandbox from pool '${pool}'…`;
}

/** "3 s", "5 min", "2 h 10 min", "4 d 3 h". */
/** Words for the resource keys the backends report (anything else is humanised). */
const RESOURCE_LABELS: Record<string, string> = {
  pid: 'Process',
  network: 'Network',
  memory_mb: 'Memory limit',
  cpu_seconds: 'CPU time limit',
  restarts: 'Restarts',
  files_dir: 'Notebook files',
  packages_dir: '%pip packages',
  disk: 'Workspace disk',
  pod: 'Pod',
  node: 'Node',
  podIPs: 'Pod IPs',
  serviceFQDN: 'Service',
  runtimeClassName: 'Runtime class',
  operatingMode: 'Operating mode'
};

/** Internal bookkeeping, or folded into another row. */
const HIDDEN_RESOURCES = new Set(['owner_pid', 'files_read_only']);

/**
 * The details dialog's resource rows, in words: "Memory limit: 2048 MB", never
 * "Resources: memory_mb". Unknown keys are humanised; empty values are left out.
 */
export function resourceRows(resources: Record<string, unknown>): [string, string][] {
  const rows: [string, string][] = [];
  for (const [key, value] of Object.entries(resources)) {
    if (HIDDEN_RESOURCES.has(key)) {
      continue;
    }
    let text: string;
    switch (key) {
      case 'pid':
        text = value ? `pid ${value}` : 'not running';
        break;
      case 'network':
        text = value === false ? 'none' : value === true ? 'outbound only' : '';
        break;
      case 'memory_mb':
        text = value ? `${value} MB` : 'none';
        break;
      case 'cpu_seconds':
        text = value ? `${value} s` : 'none';
        break;
      case 'packages_dir':
        text = value
          ? `kept for this project in ${value} (to give every sandbox of a pool ` +
            "a package: jupyter-sandbox pool create NAME --requirements FILE)"
          : '';
        break;
      case 'files_dir':
        text = value ? `${value}${resources.files_read_only ? ' (read-only)' : ''}` : '';
        break;
      case 'disk': {
        const disk = value as IDiskUse | null;
        if (!disk) {
          text = '';
        } else {
          const used = disk.used_mb === null ? 'not measured yet' : `${disk.used_mb} MB`;
          const limit = disk.limit_mb === null ? ' (no limit)' : ` of ${disk.limit_mb} MB`;
          const state = disk.over ? (disk.enforced ? ' (full)' : ' (over the limit)') : '';
          text = `${used}${limit}${disk.enforced ? ', enforced' : ''}${state}`;
        }
        break;
      }
      default:
        text = Array.isArray(value)
          ? value.join(', ')
          : value === null || value === undefined
            ? ''
            : String(value);
    }
    if (text) {
      rows.push([RESOURCE_LABELS[key] ?? humanise(key), text]);
    }
  }
  return rows;
}

function humanise(key: string): string {
  const words = key
    .replace(/([a-z])([A-Z])/g, '$1 $2')
    .replace(/_/g, ' ')
    .toLowerCase();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

export function formatAge(seconds: number): string {
  if (!isFinite(seconds) || seconds < 0) {
    return '–';
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return `${m} min`;
  }
  const h = Math.floor(m / 60);
  if (h < 24) {
    return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
  }
  const d = Math.floor(h / 24);
  return h % 24 ? `${d} d ${h % 24} h` : `${d} d`;
}

/** Age of a sandbox from its creation time (seconds since the epoch). */
export function sandboxAge(
  created: number | null | undefined,
  nowMs: number = Date.now()
): string {
  if (!created) {
    return '–';
  }
  return formatAge(nowMs / 1000 - created);
}

/** "2/3 warm" for a pool, plus what is starting. */
export function poolSummary(pool: IPoolEntry): string {
  const parts = [`${pool.ready}/${pool.replicas} warm`];
  if (pool.starting) {
    parts.push(`${pool.starting} starting`);
  }
  if (pool.claimed) {
    parts.push(`${pool.claimed} in use`);
  }
  return parts.join(', ');
}

/** Does a kernelspec select the sandbox provisioner? Which pool and backend? */
export function sandboxSpecInfo(
  spec: { metadata?: Record<string, unknown> } | null | undefined
): { pool: string; backend: string } | null {
  const meta = spec?.metadata?.['jupyter_sandbox'] as
    | { pool?: unknown; backend?: unknown }
    | undefined;
  if (meta && typeof meta.pool === 'string') {
    return {
      pool: meta.pool,
      backend: typeof meta.backend === 'string' ? meta.backend : 'local'
    };
  }
  const provisioner = spec?.metadata?.['kernel_provisioner'] as
    | { provisioner_name?: unknown; config?: { pool?: unknown; backend?: unknown } }
    | undefined;
  if (provisioner?.provisioner_name === 'sandbox-provisioner') {
    const pool = provisioner.config?.pool;
    const backend = provisioner.config?.backend;
    return {
      pool: typeof pool === 'string' ? pool : 'default',
      backend: typeof backend === 'string' ? backend : 'local'
    };
  }
  return null;
}

export interface IServerSentEvent {
  event: string;
  data: string;
  id?: string;
}

/**
 * Incremental parser of a `text/event-stream` body (the WHATWG format):
 * feed it text as it arrives, get whole events back.
 */
export class EventStreamParser {
  private _buffer = '';
  private _event = '';
  private _data: string[] = [];
  private _id: string | undefined;

  feed(chunk: string): IServerSentEvent[] {
    this._buffer += chunk;
    const events: IServerSentEvent[] = [];
    let newline: number;
    while ((newline = this._nextLineEnd()) >= 0) {
      let line = this._buffer.slice(0, newline);
      let skip = 1;
      if (this._buffer[newline] === '\r' && this._buffer[newline + 1] === '\n') {
        skip = 2;
      }
      this._buffer = this._buffer.slice(newline + skip);
      if (line === '') {
        if (this._data.length) {
          events.push({
            event: this._event || 'message',
            data: this._data.join('\n'),
            ...(this._id !== undefined ? { id: this._id } : {})
          });
        }
        this._event = '';
        this._data = [];
        continue;
      }
      if (line.startsWith(':')) {
        continue; // a comment (keep-alive)
      }
      const colon = line.indexOf(':');
      let field = line;
      let value = '';
      if (colon >= 0) {
        field = line.slice(0, colon);
        value = line.slice(colon + 1);
        if (value.startsWith(' ')) {
          value = value.slice(1);
        }
      }
      line = '';
      if (field === 'event') {
        this._event = value;
      } else if (field === 'data') {
        this._data.push(value);
      } else if (field === 'id') {
        this._id = value;
      }
    }
    return events;
  }

  private _nextLineEnd(): number {
    const n = this._buffer.indexOf('\n');
    const r = this._buffer.indexOf('\r');
    if (r >= 0 && (n < 0 || r < n)) {
      // A lone CR at the very end may be the first half of CRLF: wait for more.
      if (r === this._buffer.length - 1) {
        return -1;
      }
      return r;
    }
    return n;
  }
}

/** Delay before the next reconnection attempt: 1 s, 2 s, 4 s … at most 30 s. */
export function backoffDelay(attempt: number): number {
  return Math.min(30000, 1000 * Math.pow(2, Math.max(0, attempt)));
}

/**
 * The details dialog's live rows: "Memory in use: 136 MB", "CPU now: 3% of a core".
 * A suspended sandbox uses nothing and says so; an unknown reading shows nothing.
 */
export function usageRows(
  usage: IUsage | null | undefined,
  suspended: boolean
): [string, string][] {
  if (suspended) {
    return [['In use', 'nothing (suspended)']];
  }
  if (!usage) {
    return [];
  }
  const rows: [string, string][] = [
    ['Memory in use', `${Math.round(usage.memory_in_use_mb)} MB`],
    ['CPU now', `${Math.round(usage.cpu_percent)}% of a core`],
    ['CPU used', `${usage.cpu_seconds_used.toFixed(1)} s`]
  ];
  if (usage.processes > 0) {
    rows.push(['Processes', String(usage.processes)]);
  }
  return rows;
}

/** The workspace's disk figures (local backend), when the daemon has measured it. */
export interface IDiskUse {
  limit_mb: number | null;
  used_mb: number | null;
  over: boolean;
  /** The limit is the workspace filesystem's size (a root daemon), not only watched. */
  enforced?: boolean;
}

/** The workspace's disk use, if the backend reports it. */
export function diskUse(sandbox: ISandboxDescription | undefined): IDiskUse | null {
  const disk = sandbox?.resources?.disk as IDiskUse | null | undefined;
  return disk && typeof disk === 'object' ? disk : null;
}

/** Which sandbox a new Sandbox Terminal opens in. */
export type TerminalTarget =
  | { kind: 'kernel'; id: string }
  | { kind: 'choose'; ids: string[] }
  | { kind: 'none' };

/**
 * The named kernel, else the focused (or last focused) one if it is sandboxed,
 * else the only sandboxed kernel running; with several and none in focus, the
 * user chooses. Suspended sandboxes count: the terminal resumes them.
 */
export function terminalTarget(
  requested: string | null,
  focused: string | null,
  kernels: IKernelEntry[]
): TerminalTarget {
  const ids = kernels.map(k => k.id);
  for (const id of [requested, focused]) {
    if (id && ids.includes(id)) {
      return { kind: 'kernel', id };
    }
  }
  if (ids.length === 1) {
    return { kind: 'kernel', id: ids[0] };
  }
  return ids.length ? { kind: 'choose', ids } : { kind: 'none' };
}

/**
 * What the Sandbox Files panel says above the sandbox's workspace. With the
 * notebook's directory bound in (the local default), its files are in the usual
 * file browser and the workspace shown here is mostly empty: say so.
 */
export function workspaceHeader(
  label: string | null,
  sandbox: ISandboxDescription | undefined
): string {
  if (!label) {
    return 'Open a sandboxed notebook or console to see its sandbox’s files.';
  }
  const bound = sandbox?.resources?.files_dir;
  if (sandbox?.files?.mode === 'copy') {
    return (
      `Workspace of the sandbox of ${label}: the notebook’s directory was copied in ` +
      'here; what the kernel changes is copied back at suspend and shutdown.'
    );
  }
  if (typeof bound === 'string' && bound) {
    return (
      `${label}: its directory (${bound}) is bound into the sandbox, so its files ` +
      'are in the file browser as usual. Below is the sandbox’s own workspace ' +
      '(/workspace, its home), for what the kernel keeps elsewhere.'
    );
  }
  return `Workspace of the sandbox of ${label}`;
}
