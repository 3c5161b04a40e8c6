import { Dialog, showDialog } from '@jupyterlab/apputils';
import { KernelSpec } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { kernelUsage, SandboxEvents } from './api';
import {
  diskUse,
  errorAdvice,
  errorText,
  IKernelEntry,
  IStartError,
  IPoolEntry,
  isolationInfo,
  ISnapshot,
  meterText,
  poolSummary,
  progressText,
  resourceRows,
  usageRows,
  sandboxAge,
  sandboxSpecInfo,
  sandboxState,
  SandboxState,
  stateLabel
} from './model';

import sandboxSvgStr from '../style/icons/sandbox.svg';

export const sandboxIcon = new LabIcon({
  name: 'jupyter-sandbox:sandbox',
  svgstr: sandboxSvgStr
});

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === 'class') {
      node.className = value;
    } else {
      node.setAttribute(key, value);
    }
  }
  for (const child of children) {
    node.append(child);
  }
  return node;
}

/** What the status bar needs to know about the active notebook. */
export interface IActiveKernel {
  /** The kernel id, once the kernel exists. */
  id: string | null;
  /** The kernelspec name (or the preferred one while starting). */
  name: string | null;
  /** The browser's view: idle, busy, starting, restarting, dead … */
  status: string | null;
}

/**
 * Status bar item for the active notebook: pool, sandbox, state, isolation.
 * Hidden when the notebook's kernel is not sandboxed.
 */

/** JupyterLab's display statuses of a notebook whose kernel is being started. */
const KERNEL_COMING = new Set(['initializing', 'starting', 'restarting', 'autorestarting']);

export class SandboxStatus extends Widget {
  constructor(
    private _events: SandboxEvents,
    private _specs: () => KernelSpec.ISpecModels | null
  ) {
    super();
    this.addClass('jp-SandboxStatus');
    this.node.setAttribute('data-sandbox-state', 'none');
    this._events.changed.connect(this.refresh, this);
    this.node.addEventListener('click', () => {
      if (this._failure) {
        void showClaimAdvice(this._failure.name, this._failure.error);
      }
    });
  }

  setActive(active: IActiveKernel | null): void {
    this._active = active;
    this.refresh();
  }

  /** The state shown now ('none' when the notebook is not sandboxed). */
  get state(): SandboxState | 'none' {
    return this._state;
  }

  get visibleForActive(): boolean {
    return this._state !== 'none';
  }

  refresh(): void {
    const active = this._active;
    const spec = active?.name ? this._specs()?.kernelspecs[active.name] : null;
    const specInfo = sandboxSpecInfo(spec ?? undefined);
    const entry: IKernelEntry | undefined = this._events.kernel(active?.id);
    this.node.textContent = '';
    const starting = this._events.snapshot.starting.find(
      s => (active?.id && s.id === active.id) || (!entry && s.name === active?.name)
    );
    // No kernel, none on its way and no failure to explain (say, after "Shut Down
    // Kernel"): nothing to show.
    const noKernel =
      !entry && !active?.id && !starting && !KERNEL_COMING.has(active?.status ?? '');
    if (!active || (!specInfo && !entry) || noKernel) {
      this._state = 'none';
      this.node.setAttribute('data-sandbox-state', 'none');
      this.node.title = '';
      this.node.style.display = 'none';
      return;
    }
    this.node.style.display = '';
    const sandbox = entry?.sandbox;
    this._failure = null;
    let state: SandboxState = sandboxState(sandbox, active.status);
    let detail = sandbox?.progress?.detail ?? '';
    if (!entry && starting?.state === 'starting') {
      state = sandboxState(starting.sandbox, 'starting');
      detail = progressText(starting);
    } else if (!entry && starting?.state === 'failed' && starting.error) {
      state = 'failed';
      detail = `${errorText(starting.error)} (click for what to do)`;
      const name = this._specs()?.kernelspecs[starting.name]?.display_name ?? starting.name;
      this._failure = { name, error: starting.error };
    } else if (!entry && !active.id) {
      state = 'claiming';
      detail = progressText({ pool: specInfo?.pool });
    }
    this._state = state;
    this.node.setAttribute('data-sandbox-state', state);
    const pool = sandbox?.pool ?? specInfo?.pool ?? '?';
    const isolation = isolationInfo(sandbox?.isolation, sandbox?.isolation_detail);

    const icon = el('span', { class: 'jp-SandboxStatus-icon' });
    sandboxIcon.element({ container: icon, height: '14px', width: '14px' });
    const parts: (Node | string)[] = [
      icon,
      el('span', { class: 'jp-SandboxStatus-pool' }, pool)
    ];
    const sep = () => el('span', { class: 'jp-SandboxStatus-sep' }, '·');
    if (sandbox?.sandbox) {
      parts.push(sep(), el('span', { class: 'jp-SandboxStatus-name' }, sandbox.sandbox));
    }
    parts.push(
      sep(),
      el(
        'span',
        { class: `jp-SandboxStatus-state jp-SandboxState-${state}` },
        stateLabel(state)
      )
    );
    const running = RUNNING_STATES.has(state) && !!active.id;
    this._followUsage(running ? active.id : null);
    const meter = running && this._usage?.id === active.id ? this._usage.text : null;
    if (meter) {
      parts.push(sep(), el('span', { class: 'jp-SandboxStatus-meter' }, meter));
    }
    if (sandbox?.isolation) {
      parts.push(
        sep(),
        el(
          'span',
          {
            class:
              'jp-SandboxStatus-isolation' +
              (isolation.warning ? ' jp-SandboxStatus-warning' : '')
          },
          isolation.warning ? `⚠ ${isolation.label}` : isolation.label
        )
      );
    }
    const disk = diskUse(sandbox);
    if (disk?.over) {
      parts.push(
        sep(),
        el('span', { class: 'jp-SandboxStatus-disk jp-SandboxStatus-warning' }, '⚠ disk full')
      );
    }
    this.node.append(...parts);
    const lines = [
      `Sandbox pool: ${pool}`,
      `Sandbox: ${sandbox?.sandbox ?? '(not claimed yet)'}`,
      `State: ${stateLabel(state)}${detail ? ` — ${detail}` : ''}`
    ];
    if (sandbox?.isolation) {
      lines.push(isolation.description);
    }
    if (sandbox?.created) {
      lines.push(`Age: ${sandboxAge(sandbox.created)}`);
    }
    if (meter) {
      lines.push(`Now: ${meter.replace('CPU', 'of a CPU core')}`);
    }
    if (disk?.over) {
      lines.push(sandbox?.message || 'The workspace is over its disk limit.');
    } else if (disk?.used_mb !== null && disk?.used_mb !== undefined && disk.limit_mb) {
      lines.push(`Workspace: ${disk.used_mb} MB of ${disk.limit_mb} MB`);
    }
    this.node.title = lines.join('\n');
  }

  dispose(): void {
    this._events.changed.disconnect(this.refresh, this);
    super.dispose();
  }

  /**
   * Poll the sandbox's usage every few seconds while ``kernelId`` (a running
   * sandbox's kernel) is the active one and the page is visible; stop otherwise.
   */
  private _followUsage(kernelId: string | null): void {
    if (kernelId === this._polled) {
      return;
    }
    this._polled = kernelId;
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    if (this._usage && this._usage.id !== kernelId) {
      this._usage = null;
    }
    if (kernelId === null) {
      return;
    }
    const poll = () => {
      if (document.hidden || this._polled !== kernelId) {
        return;
      }
      kernelUsage(kernelId)
        .then(entry => {
          if (this._polled === kernelId) {
            this._usage = { id: kernelId, text: meterText(entry.usage) };
            this.refresh();
          }
        })
        .catch(() => {
          /* gone or suspended meanwhile: the next state change stops the polling */
        });
    };
    poll();
    this._timer = window.setInterval(poll, USAGE_POLL_MS);
  }

  private _active: IActiveKernel | null = null;
  private _state: SandboxState | 'none' = 'none';
  private _failure: { name: string; error: Partial<IStartError> } | null = null;
  private _usage: { id: string; text: string | null } | null = null;
  private _polled: string | null = null;
  private _timer: number | null = null;
}

const USAGE_POLL_MS = 5000;
/** States in which a sandbox has processes to measure. */
const RUNNING_STATES = new Set<SandboxState | 'none'>(['ready', 'busy', 'idle']);

/** Why a sandbox could not be claimed, and what the user can do about it. */
export async function showClaimAdvice(name: string, error: Partial<IStartError>): Promise<void> {
  const body = el(
    'div',
    { class: 'jp-SandboxAdvice' },
    el('p', {}, `${name}: ${errorText(error)}`),
    el('p', {}, errorAdvice(error))
  );
  await showDialog({
    title: 'The sandbox could not be claimed',
    body: new Widget({ node: body }),
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
}

export interface IPanelActions {
  suspend(kernelId: string): void;
  resume(kernelId: string): void;
  details(kernelId: string): void;
  open(kernelId: string): void;
}

/** The side panel: pools (warm / target) and this server's sandboxed kernels. */
export class SandboxPanel extends Widget {
  constructor(
    private _events: SandboxEvents,
    private _actions: IPanelActions,
    private _sessionPath: (kernelId: string) => string | null
  ) {
    super();
    this.id = 'jupyter-sandbox-panel';
    this.addClass('jp-SandboxPanel');
    this.title.icon = sandboxIcon;
    this.title.caption = 'Sandboxes';
    this._events.changed.connect(this.render, this);
    this.render();
  }

  render(): void {
    const snapshot: ISnapshot = this._events.snapshot;
    this.node.textContent = '';
    const header = el(
      'div',
      { class: 'jp-SandboxPanel-header' },
      el('h2', {}, 'Sandboxes'),
      el(
        'span',
        {
          class:
            'jp-SandboxPanel-live' + (this._events.connected ? '' : ' jp-SandboxPanel-offline'),
          title: this._events.connected
            ? 'Live: updated by server events'
            : 'Not connected to the server; reconnecting'
        },
        this._events.connected ? '● live' : '○ offline'
      )
    );
    this.node.append(header);

    this.node.append(el('h3', {}, 'Pools'));
    if (!snapshot.daemon.running && snapshot.pools.length === 0 && !snapshot.kubernetes) {
      this.node.append(
        el(
          'p',
          { class: 'jp-SandboxPanel-empty' },
          'The local sandbox service is not running; it starts with the first sandboxed kernel.'
        )
      );
    } else if (snapshot.pools.length === 0) {
      this.node.append(el('p', { class: 'jp-SandboxPanel-empty' }, 'No pools.'));
    } else {
      const table = el('table', { class: 'jp-SandboxPanel-pools' });
      table.append(
        el(
          'tr',
          {},
          el('th', {}, 'Pool'),
          el('th', {}, 'Warm'),
          el('th', {}, 'Isolation')
        )
      );
      for (const pool of snapshot.pools) {
        table.append(this._poolRow(pool));
      }
      this.node.append(table);
    }

    if (snapshot.kubernetes && !snapshot.kubernetes.ok) {
      this.node.append(
        el(
          'p',
          { class: 'jp-SandboxStatus-warning' },
          `Kubernetes pools unavailable: ${snapshot.kubernetes.message}`
        )
      );
    }

    this.node.append(el('h3', {}, 'Your sandboxed kernels'));
    const starting = snapshot.starting;
    if (snapshot.kernels.length === 0 && starting.length === 0) {
      this.node.append(el('p', { class: 'jp-SandboxPanel-empty' }, 'None running.'));
    }
    const list = el('ul', { class: 'jp-SandboxPanel-kernels' });
    for (const entry of starting) {
      const text =
        entry.state === 'failed' && entry.error
          ? `${entry.name}: failed — ${errorText(entry.error)}`
          : `${entry.name}: ${progressText(entry)}`;
      list.append(
        el(
          'li',
          {
            class: `jp-SandboxPanel-kernel jp-SandboxState-${entry.state}`,
            'data-sandbox-state': entry.state,
            title: entry.error ? errorAdvice(entry.error) : ''
          },
          text
        )
      );
    }
    for (const kernel of snapshot.kernels) {
      list.append(this._kernelItem(kernel));
    }
    this.node.append(list);
  }

  private _poolRow(pool: IPoolEntry): HTMLElement {
    const isolation = isolationInfo(pool.isolation);
    return el(
      'tr',
      { 'data-pool': pool.name },
      el(
        'td',
        { title: `${pool.display_name} (${pool.backend ?? 'local'}, ${pool.namespace})` },
        pool.backend === 'kubernetes' ? `${pool.name} (k8s)` : pool.name
      ),
      el('td', { class: 'jp-SandboxPanel-warm' }, poolSummary(pool)),
      el(
        'td',
        {
          class: isolation.warning ? 'jp-SandboxStatus-warning' : '',
          title: isolation.description
        },
        isolation.warning ? `⚠ ${isolation.label}` : isolation.label
      )
    );
  }

  private _kernelItem(kernel: IKernelEntry): HTMLElement {
    const sandbox = kernel.sandbox;
    const state = sandboxState(sandbox, kernel.execution_state);
    const path = this._sessionPath(kernel.id);
    const item = el('li', {
      class: `jp-SandboxPanel-kernel jp-SandboxState-${state}`,
      'data-kernel-id': kernel.id,
      'data-sandbox-state': state
    });
    const title = el(
      'a',
      { class: 'jp-SandboxPanel-kernelName', href: '#', title: 'Open its notebook' },
      path ?? kernel.name
    );
    title.addEventListener('click', event => {
      event.preventDefault();
      this._actions.open(kernel.id);
    });
    const isolation = isolationInfo(sandbox.isolation, sandbox.isolation_detail);
    item.append(
      title,
      el(
        'div',
        { class: 'jp-SandboxPanel-kernelInfo' },
        `${sandbox.pool ?? '?'} · ${sandbox.sandbox ?? '–'} · `,
        el('span', { class: `jp-SandboxStatus-state jp-SandboxState-${state}` }, stateLabel(state)),
        ` · ${sandboxAge(sandbox.created)}`,
        isolation.warning
          ? el('span', { class: 'jp-SandboxStatus-warning' }, ` · ⚠ ${isolation.label}`)
          : ''
      )
    );
    const buttons = el('div', { class: 'jp-SandboxPanel-actions' });
    const button = (label: string, action: () => void, disabled = false) => {
      const b = el('button', { class: 'jp-mod-styled jp-mod-small', type: 'button' }, label);
      b.disabled = disabled;
      b.addEventListener('click', action);
      buttons.append(b);
    };
    button('Suspend', () => this._actions.suspend(kernel.id), !!sandbox.suspended);
    button('Resume', () => this._actions.resume(kernel.id), !sandbox.suspended);
    button('Details', () => this._actions.details(kernel.id));
    item.append(buttons);
    return item;
  }

  dispose(): void {
    this._events.changed.disconnect(this.render, this);
    super.dispose();
  }
}

/** The details dialog body: workspace, age, resources and more. */
export function detailsNode(entry: IKernelEntry): HTMLElement {
  const sandbox = entry.sandbox;
  const isolation = isolationInfo(sandbox.isolation, sandbox.isolation_detail);
  const state = sandboxState(sandbox, entry.execution_state);
  const rows: [string, string][] = [
    ['Pool', sandbox.pool ?? '–'],
    ['Sandbox', sandbox.sandbox ?? '–'],
    ['Claim', sandbox.claim ?? '–'],
    ['Backend', entry.backend],
    ['State', `${stateLabel(state)}${sandbox.progress?.detail ? ` (${sandbox.progress.detail})` : ''}`],
    ...usageRows(entry.usage, Boolean(sandbox.suspended)),
    ['Isolation', isolation.description],
    ['Workspace', sandbox.workspace ?? '–'],
    ['Age', sandboxAge(sandbox.created)],
    [
      'Claimed',
      sandbox.warm === true ? 'warm (from the pool)' : sandbox.warm === false ? 'cold start' : '–'
    ]
  ];
  const resources = {
    ...(sandbox.resources ?? {}),
    ...((entry.claim_status?.resources as Record<string, unknown>) ?? {})
  };
  rows.push(...resourceRows(resources));
  const files = sandbox.files;
  if (files) {
    rows.push(['Notebook files', `copied from ${files.dir}`]);
    rows.push(['Copied in', files.copied_in ?? '–']);
    if (files.last?.direction === 'back' && files.last_summary) {
      rows.push(['Last copied back', files.last_summary]);
    }
  }
  const table = el('table', { class: 'jp-SandboxDetails' });
  for (const [key, value] of rows) {
    const th = el('th', {}, key);
    const td = el('td', {}, value);
    if (key === 'Isolation' && isolation.warning) {
      td.classList.add('jp-SandboxStatus-warning');
    }
    table.append(el('tr', {}, th, td));
  }
  return table;
}
