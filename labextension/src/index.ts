import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  ISessionContext,
  MainAreaWidget,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ILauncher } from '@jupyterlab/launcher';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel, KernelAPI, KernelSpec, ServerConnection, Session } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Terminal } from '@jupyterlab/terminal';
import { CommandToolbarButton, LabIcon, pauseIcon, runIcon, infoIcon } from '@jupyterlab/ui-components';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  copyFilesBack,
  isKernelBusy,
  kernelDetails,
  resumeKernel,
  SandboxEvents,
  suspendKernel
} from './api';
import {
  diskUse,
  IKernelActivity,
  IReadyKernel,
  ISnapshot,
  IStartingKernel,
  progressText,
  readyText,
  sandboxSpecInfo,
  secondsToIdleCull,
  startsText,
  terminalTarget
} from './model';
import { SandboxTerminalConnection } from './terminal';
import { detailsNode, IActiveKernel, SandboxPanel, SandboxStatus, sandboxIcon } from './widgets';
import { SandboxDrive, WorkspacePanel } from './workspace';

import '../style/index.css';

export namespace CommandIDs {
  export const suspend = 'jupyter-sandbox:suspend';
  export const resume = 'jupyter-sandbox:resume';
  export const details = 'jupyter-sandbox:details';
  export const copyBack = 'jupyter-sandbox:copy-back';
  export const showPanel = 'jupyter-sandbox:show-panel';
  export const newNotebook = 'jupyter-sandbox:new-notebook';
  export const newConsole = 'jupyter-sandbox:new-console';
  export const terminal = 'jupyter-sandbox:open-terminal';
}

const CATEGORY = 'Sandbox';
export const LAUNCHER_NOTEBOOKS = 'Sandboxed notebooks';
export const LAUNCHER_CONSOLES = 'Sandboxed consoles';

function isSandboxSpec(specs: KernelSpec.ISpecModels | null, name: unknown): boolean {
  return typeof name === 'string' && !!sandboxSpecInfo(specs?.kernelspecs[name] ?? undefined);
}

/** The kernelspec's own SVG logo as a LabIcon (falls back to the bundled sandbox icon). */
async function kernelIcon(spec: KernelSpec.ISpecModel): Promise<LabIcon> {
  const url = spec.resources?.['logo-svg'];
  if (!url) {
    return sandboxIcon;
  }
  try {
    const settings = ServerConnection.makeSettings();
    const response = await ServerConnection.makeRequest(url, {}, settings);
    const svgstr = await response.text();
    if (!response.ok || !svgstr.includes('<svg')) {
      return sandboxIcon;
    }
    return new LabIcon({ name: `jupyter-sandbox:kernel-${spec.name}`, svgstr });
  } catch {
    return sandboxIcon;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-sandbox:plugin',
  description: 'Sandboxed kernels: status bar, pools panel, suspend/resume, claim progress.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [
    IStatusBar,
    ICommandPalette,
    ILauncher,
    IMainMenu,
    IConsoleTracker,
    ILabShell,
    IDocumentManager
  ],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    mainMenu: IMainMenu | null,
    consoles: IConsoleTracker | null,
    labShell: ILabShell | null,
    docManager: IDocumentManager | null
  ) => {
    const { commands, serviceManager } = app;
    const specs = (): KernelSpec.ISpecModels | null => serviceManager.kernelspecs.specs;
    const events = new SandboxEvents(serviceManager.serverSettings);

    // -- the active notebook or console ---------------------------------------
    const status = new SandboxStatus(events, specs);
    const trackers: IKernelWidgetTracker[] = consoles ? [tracker, consoles] : [tracker];
    let lastChanged: IKernelWidget | null = null;
    // The widget in focus if it has a kernel, else the one that last had focus.
    const current = (): IKernelWidget | null => {
      const inShell = app.shell.currentWidget;
      const tracked = trackers.map(t => t.currentWidget).filter(w => !!w) as IKernelWidget[];
      return (
        tracked.find(w => w === inShell) ??
        tracked.find(w => w === lastChanged) ??
        tracked[0] ??
        null
      );
    };
    const active = (): IActiveKernel | null => {
      const panel = current();
      if (!panel) {
        return null;
      }
      const context = panel.sessionContext;
      const kernel = context.session?.kernel ?? null;
      return {
        id: kernel?.id ?? null,
        name: kernel?.name ?? context.kernelPreference.name ?? null,
        status: kernel?.status ?? context.kernelDisplayStatus ?? null
      };
    };
    const activeKernelId = (): string | null => active()?.id ?? null;
    // Set up below, with the side panel (it needs the session names).
    let showWorkspace: ((kernelId: string | null) => void) | null = null;
    const updateActive = () => {
      status.setActive(active());
      showWorkspace?.(activeKernelId());
      for (const id of [
        CommandIDs.suspend,
        CommandIDs.resume,
        CommandIDs.details,
        CommandIDs.copyBack
      ]) {
        if (commands.hasCommand(id)) {
          commands.notifyCommandChanged(id);
        }
      }
    };
    let watched: IKernelWidget | null = null;
    const watch = (panel: IKernelWidget | null) => {
      if (watched) {
        watched.sessionContext.statusChanged.disconnect(updateActive);
        watched.sessionContext.kernelChanged.disconnect(updateActive);
        watched.sessionContext.connectionStatusChanged.disconnect(updateActive);
      }
      watched = panel;
      if (panel) {
        panel.sessionContext.statusChanged.connect(updateActive);
        panel.sessionContext.kernelChanged.connect(updateActive);
        panel.sessionContext.connectionStatusChanged.connect(updateActive);
      }
      updateActive();
    };
    for (const t of trackers) {
      t.currentChanged.connect((_, widget) => {
        lastChanged = widget ?? lastChanged;
        watch(current());
      });
    }
    labShell?.currentChanged.connect(() => watch(current()));
    watch(current());
    events.changed.connect(() => updateActive());
    serviceManager.kernelspecs.specsChanged.connect(() => updateActive());

    if (statusBar) {
      statusBar.registerStatusItem('jupyter-sandbox:status', {
        item: status,
        align: 'left',
        rank: 5,
        isActive: () => !!current()
      });
    }

    // -- commands ----------------------------------------------------------
    const targetKernel = (args: ReadonlyPartialJSONObject): string | null =>
      typeof args.kernelId === 'string' ? args.kernelId : activeKernelId();
    const activeEntry = (args: ReadonlyPartialJSONObject) => events.kernel(targetKernel(args));
    // Toolbar buttons show only on notebooks whose kernel is sandboxed.
    const visible = (args: ReadonlyPartialJSONObject) =>
      !args.toolbar || typeof args.kernelId === 'string' || status.state !== 'none';

    commands.addCommand(CommandIDs.suspend, {
      label: 'Suspend Sandbox',
      isVisible: visible,
      caption: 'Release the sandbox compute now; the workspace is kept and the next run resumes it',
      icon: args => (args.toolbar ? pauseIcon : undefined),
      isEnabled: args => {
        const entry = activeEntry(args);
        return !!entry && !entry.sandbox.suspended;
      },
      execute: async args => {
        const kernelId = targetKernel(args);
        if (!kernelId) {
          return;
        }
        const busy = () =>
          showDialog({
            title: 'The kernel is running a cell',
            body:
              'Suspending now stops that cell: its work and the kernel\'s variables are ' +
              'lost. Wait until it finishes (or interrupt it) and suspend then, or ' +
              'suspend anyway.',
            buttons: [
              Dialog.cancelButton({ label: 'Keep running' }),
              Dialog.warnButton({ label: 'Suspend anyway' })
            ],
            defaultButton: 0 // Enter keeps the cell running
          }).then(result => result.button.accept);
        let force = false;
        if (activeEntry(args)?.execution_state === 'busy') {
          if (!(await busy())) {
            return;
          }
          force = true;
        }
        try {
          suspendedByUser.add(kernelId); // its own toast below; no second one
          let entry;
          try {
            entry = await suspendKernel(kernelId, force);
          } catch (err) {
            // busy by the time the request arrived: the same choice
            if (force || !isKernelBusy(err)) {
              throw err;
            }
            if (!(await busy())) {
              suspendedByUser.delete(kernelId);
              return;
            }
            entry = await suspendKernel(kernelId, true);
          }
          events.updateKernel(entry);
          Notification.info(
            `Sandbox ${entry.sandbox.sandbox ?? ''} suspended: workspace kept, the next run resumes it.`,
            { autoClose: 4000 }
          );
        } catch (err) {
          Notification.error(`Could not suspend the sandbox: ${(err as Error).message}`);
        }
      }
    });
    commands.addCommand(CommandIDs.resume, {
      label: 'Resume Sandbox',
      isVisible: visible,
      caption: 'Start the suspended sandbox again (a new kernel process, same workspace)',
      icon: args => (args.toolbar ? runIcon : undefined),
      isEnabled: args => !!activeEntry(args)?.sandbox.suspended,
      execute: async args => {
        const kernelId = targetKernel(args);
        if (!kernelId) {
          return;
        }
        const id = Notification.emit('Resuming the sandbox…', 'in-progress', {
          autoClose: false
        });
        try {
          events.updateKernel(await resumeKernel(kernelId));
          Notification.update({
            id,
            message: 'Sandbox resumed: the kernel is new, the workspace is kept.',
            type: 'success',
            autoClose: 4000
          });
        } catch (err) {
          Notification.update({
            id,
            message: `Could not resume the sandbox: ${(err as Error).message}`,
            type: 'error',
            autoClose: false
          });
        }
      }
    });
    commands.addCommand(CommandIDs.details, {
      label: 'Show Sandbox Details',
      isVisible: visible,
      caption: 'Pool, sandbox, workspace path, age, resources and isolation',
      icon: args => (args.toolbar ? infoIcon : undefined),
      isEnabled: args => !!activeEntry(args),
      execute: async args => {
        const kernelId = targetKernel(args);
        if (!kernelId) {
          return;
        }
        try {
          const entry = await kernelDetails(kernelId);
          await showDialog({
            title: 'Sandbox details',
            body: new Widget({ node: detailsNode(entry) }),
            buttons: [Dialog.okButton({ label: 'Close' })]
          });
        } catch (err) {
          Notification.error(`Could not read the sandbox details: ${(err as Error).message}`);
        }
      }
    });

    commands.addCommand(CommandIDs.copyBack, {
      label: 'Copy Sandbox Files Back',
      caption:
        "Copy what the kernel created or changed into the notebook's directory now " +
        '(also done at suspend and shutdown)',
      isVisible: args => !args.toolbar && (!!activeEntry(args)?.sandbox.files || !!args.kernelId),
      isEnabled: args => {
        const entry = activeEntry(args);
        return !!entry?.sandbox.files && !entry.sandbox.suspended;
      },
      execute: async args => {
        const kernelId = targetKernel(args);
        if (!kernelId) {
          return;
        }
        try {
          const entry = await copyFilesBack(kernelId);
          events.updateKernel(entry);
          if (commands.hasCommand('filebrowser:refresh')) {
            void commands.execute('filebrowser:refresh');
          }
          const summary = entry.sandbox.files?.last_summary ?? 'done';
          const type = entry.sandbox.files?.last?.conflicts.length ? 'warning' : 'success';
          Notification.emit(`Sandbox files: ${summary}.`, type, { autoClose: 8000 });
        } catch (err) {
          Notification.error(`Could not copy the sandbox's files back: ${(err as Error).message}`);
        }
      }
    });

    for (const command of [
      CommandIDs.suspend,
      CommandIDs.resume,
      CommandIDs.details,
      CommandIDs.copyBack
    ]) {
      palette?.addItem({ command, category: CATEGORY });
    }
    mainMenu?.kernelMenu.addGroup(
      [
        { command: CommandIDs.suspend },
        { command: CommandIDs.resume },
        { command: CommandIDs.details },
        { command: CommandIDs.copyBack }
      ],
      1000
    );

    // Notebook toolbar: the three actions, after the kernel status.
    tracker.widgetAdded.connect((_, panel) => {
      const button = (id: string, name: string) =>
        panel.toolbar.addItem(
          name,
          new CommandToolbarButton({ commands, id, args: { toolbar: true } })
        );
      button(CommandIDs.suspend, 'sandbox-suspend');
      button(CommandIDs.resume, 'sandbox-resume');
      button(CommandIDs.details, 'sandbox-details');
    });

    // -- the side panel ---------------------------------------------------
    const sessionOf = (kernelId: string): Session.IModel | null => {
      for (const model of serviceManager.sessions.running()) {
        if (model.kernel?.id === kernelId) {
          return model;
        }
      }
      return null;
    };
    // A console's session path is an id ('console-1-<uuid>'); its name reads 'Console 1'.
    const sessionPath = (kernelId: string): string | null => {
      const model = sessionOf(kernelId);
      return model ? (model.type === 'console' ? model.name : model.path) : null;
    };
    const panel = new SandboxPanel(
      events,
      {
        suspend: kernelId => void commands.execute(CommandIDs.suspend, { kernelId }),
        resume: kernelId => void commands.execute(CommandIDs.resume, { kernelId }),
        details: kernelId => void commands.execute(CommandIDs.details, { kernelId }),
        open: kernelId => {
          const model = sessionOf(kernelId);
          if (model?.type === 'console') {
            void commands.execute('console:open', { path: model.path, activate: true });
          } else if (model) {
            void commands.execute('docmanager:open', { path: model.path });
          }
        }
      },
      sessionPath
    );
    app.shell.add(panel, 'left', { rank: 650 });

    // -- a terminal inside a sandbox ----------------------------------------
    let terminals = 0;
    const openTerminal = (kernelId: string) => {
      const entry = events.kernel(kernelId);
      const sandbox = entry?.sandbox.sandbox ?? kernelId.slice(0, 8);
      const connection = new SandboxTerminalConnection(
        kernelId,
        `in sandbox ${sandbox}`,
        serviceManager.serverSettings
      );
      const content = new Terminal(connection, { shutdownOnClose: true });
      const widget = new MainAreaWidget({ content });
      widget.id = `jp-SandboxTerminal-${++terminals}`;
      widget.addClass('jp-SandboxTerminal');
      widget.title.label = `Terminal in sandbox ${sandbox}`;
      widget.title.icon = sandboxIcon;
      widget.title.closable = true;
      content.title.caption =
        `A shell inside the sandbox of ${sessionPath(kernelId) ?? entry?.name ?? kernelId}: ` +
        'it sees what the kernel sees, not the server.';
      app.shell.add(widget, 'main');
      app.shell.activateById(widget.id);
    };
    commands.addCommand(CommandIDs.terminal, {
      label: args => (args.isLauncher ? 'Sandbox Terminal' : 'Open a Terminal in the Sandbox'),
      caption: "A terminal inside a sandboxed kernel's sandbox (the focused notebook's)",
      icon: args => (args.isLauncher ? sandboxIcon : undefined),
      execute: async args => {
        const requested = typeof args.kernelId === 'string' ? args.kernelId : null;
        const target = terminalTarget(requested, activeKernelId(), events.snapshot.kernels);
        if (target.kind === 'kernel') {
          openTerminal(target.id);
          return;
        }
        if (target.kind === 'none') {
          await showDialog({
            title: 'No sandboxed kernel is running',
            body:
              "A Sandbox Terminal runs inside a sandboxed kernel's sandbox. Open a notebook " +
              'or console with a sandboxed kernel first, then open the terminal from it.',
            buttons: [Dialog.okButton({ label: 'Close' })]
          });
          return;
        }
        const labels = target.ids.map(id => {
          const entry = events.kernel(id);
          return `${sessionPath(id) ?? entry?.name ?? id} (${entry?.sandbox.sandbox ?? id})`;
        });
        const chosen = await InputDialog.getItem({
          title: 'Open a terminal in the sandbox of',
          items: labels
        });
        if (chosen.button.accept && chosen.value) {
          openTerminal(target.ids[labels.indexOf(chosen.value)]);
        }
      }
    });
    palette?.addItem({ command: CommandIDs.terminal, category: CATEGORY });
    launcher?.add({
      command: CommandIDs.terminal,
      args: { isLauncher: true },
      category: 'Other',
      rank: 100 // last: the section keeps JupyterLab's own icon
    });

    // -- the workspace of the focused kernel's sandbox, in a file browser ------
    if (docManager) {
      // The drive follows the panel: a file opened from it keeps its sandbox until
      // another sandboxed notebook or console takes the focus.
      let workspace: WorkspacePanel | null = null;
      const drive = new SandboxDrive(
        serviceManager.serverSettings,
        () => workspace?.kernelId ?? null
      );
      serviceManager.contents.addDrive(drive);
      workspace = new WorkspacePanel(docManager);
      app.shell.add(workspace, 'left', { rank: 651 });
      const shownIn = workspace;
      showWorkspace = kernelId => {
        const sandboxed = kernelId && events.kernel(kernelId) ? kernelId : null;
        shownIn.showSandbox(
          sandboxed ? (sessionPath(sandboxed) ?? sandboxed) : null,
          sandboxed,
          sandboxed ? events.kernel(sandboxed)?.sandbox : undefined
        );
      };
      updateActive();
    }
    commands.addCommand(CommandIDs.showPanel, {
      label: 'Show Sandboxes Panel',
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: CommandIDs.showPanel, category: CATEGORY });

    // -- claim progress and errors, in words -------------------------------
    watchStarts(events, specs);
    watchDisks(events);
    watchSuspensions(events, sessionPath);
    watchIdleCulls(events, sessionPath, kernelId => {
      for (const t of trackers) {
        let found: Kernel.IKernelConnection | null = null;
        t.forEach(widget => {
          const kernel = widget.sessionContext.session?.kernel;
          if (!found && kernel?.id === kernelId) {
            found = kernel;
          }
        });
        if (found) {
          return found;
        }
      }
      return null;
    });

    // -- launcher: sandboxed kernels in their own sections ------------------
    if (launcher) {
      void setUpLauncher(app, launcher, specs);
    }
  }
};

/** A notebook or a console: a widget with a kernel session. */
interface IKernelWidget extends Widget {
  readonly sessionContext: ISessionContext;
}

interface IKernelWidgetTracker {
  readonly currentWidget: IKernelWidget | null;
  readonly currentChanged: ISignal<unknown, IKernelWidget | null>;
  forEach(fn: (widget: IKernelWidget) => void): void;
}

const IDLE_CHECK_MS = 10_000;

/**
 * Say before an idle cull suspends a sandbox (or, on a server without the sandbox
 * kernel manager, shuts its kernel down), with a button that counts as activity.
 * Asks jupyter_server for its kernels' activity only while one is sandboxed and
 * the page is visible.
 */
function watchIdleCulls(
  events: SandboxEvents,
  sessionPath: (kernelId: string) => string | null,
  connection: (kernelId: string) => Kernel.IKernelConnection | null
): void {
  const shown = new Map<string, string>(); // kernel id -> notification id
  const dismiss = (kernelId: string) => {
    const id = shown.get(kernelId);
    if (id) {
      Notification.dismiss(id);
      shown.delete(kernelId);
    }
  };
  const check = async () => {
    const snapshot = events.snapshot;
    const sandboxed = new Set(
      snapshot.kernels.filter(k => !k.sandbox.suspended).map(k => k.id)
    );
    for (const id of Array.from(shown.keys())) {
      if (!sandboxed.has(id)) {
        dismiss(id);
      }
    }
    if (!sandboxed.size || !snapshot.culling?.idle_timeout || document.hidden) {
      return;
    }
    const models = await KernelAPI.listRunning();
    for (const model of models) {
      if (!sandboxed.has(model.id)) {
        continue;
      }
      const left = secondsToIdleCull(
        model as unknown as IKernelActivity,
        snapshot.culling,
        Date.now()
      );
      if (left === null) {
        dismiss(model.id);
        continue;
      }
      if (shown.has(model.id)) {
        continue;
      }
      const what = sessionPath(model.id) ?? model.name;
      const when = left >= 60 ? `in about ${Math.round(left / 60)} min` : 'in under a minute';
      const fate = snapshot.culling.suspends
        ? `its sandbox will be suspended ${when}. Files and variables are kept; the ` +
          'next run resumes it.'
        : `its kernel will be shut down ${when}.`;
      const kernel = connection(model.id);
      shown.set(
        model.id,
        Notification.warning(`${what} has been idle: ${fate}`, {
          autoClose: false,
          actions: kernel
            ? [
                {
                  label: 'Keep running',
                  caption: 'Counts as activity: the idle time starts again',
                  callback: () => {
                    shown.delete(model.id);
                    // jupyter_server counts an execution, not kernel_info, as activity
                    kernel.requestExecute({ code: '', silent: true, store_history: false });
                  }
                }
              ]
            : []
        })
      );
    }
  };
  setInterval(() => {
    check().catch(err => console.warn('jupyter-sandbox: idle check failed', err));
  }, IDLE_CHECK_MS);
}

/** Kernels the user suspended by command (that command says so itself). */
const suspendedByUser = new Set<string>();

/** Say when a sandbox was suspended behind the user's back (an idle cull). */
function watchSuspensions(
  events: SandboxEvents,
  sessionPath: (kernelId: string) => string | null
): void {
  const suspended = new Map<string, boolean>();
  events.changed.connect((_, snapshot: ISnapshot) => {
    const present = new Set<string>();
    for (const kernel of snapshot.kernels) {
      present.add(kernel.id);
      const now = !!kernel.sandbox.suspended;
      const before = suspended.get(kernel.id);
      suspended.set(kernel.id, now);
      if (!now) {
        suspendedByUser.delete(kernel.id);
        continue;
      }
      if (before === false && !suspendedByUser.has(kernel.id)) {
        const what = sessionPath(kernel.id) ?? kernel.name;
        Notification.info(
          `${what}: its sandbox was suspended while idle. Files are kept; the next run ` +
            'resumes it with its variables.',
          { autoClose: 8000 }
        );
      }
    }
    for (const id of Array.from(suspended.keys())) {
      if (!present.has(id)) {
        suspended.delete(id);
      }
    }
  });
}

/**
 * Tell the user what a starting kernel waits for.
 *
 * An outcome replaces the progress notification rather than updating it: JupyterLab
 * drops an update that arrives before the first toast is rendered, and a claim can
 * fail within milliseconds of starting.
 */
function watchStarts(events: SandboxEvents, specs: () => KernelSpec.ISpecModels | null): void {
  // One toast for every start under way (a restored workspace starts several at
  // once), and one outcome when the last is done: never a stack of them.
  let shown: string | null = null; // the progress notification's id
  const starting = new Set<string>();
  let ready: IReadyKernel[] = [];
  const display = (name: string) => specs()?.kernelspecs[name]?.display_name ?? name;
  events.changed.connect((_, snapshot: ISnapshot) => {
    const live: IStartingKernel[] = [];
    for (const entry of snapshot.starting) {
      // A failed start needs no toast of its own: JupyterLab's "Error Starting Kernel"
      // dialog shows the server's message (with its hint), and the status bar item
      // turns red and gives the advice on a click.
      if (entry.state === 'starting') {
        const key = entry.id ?? `${entry.name}@${entry.at}`;
        live.push({ key, display: display(entry.name), progress: progressText(entry) });
      }
    }
    const now = new Set(live.map(k => k.key));
    for (const key of Array.from(starting)) {
      if (now.has(key)) {
        continue;
      }
      starting.delete(key);
      const kernel = snapshot.kernels.find(k => k.id === key);
      if (kernel) {
        ready.push({ sandbox: kernel.sandbox.sandbox ?? key, warm: !!kernel.sandbox.warm });
      }
    }
    live.forEach(k => starting.add(k.key));
    if (live.length) {
      const message = startsText(live);
      if (shown) {
        Notification.update({ id: shown, message, type: 'in-progress' });
      } else {
        shown = Notification.emit(message, 'in-progress', { autoClose: false });
      }
      return;
    }
    if (shown) {
      Notification.dismiss(shown);
      shown = null;
    }
    if (ready.length) {
      Notification.success(readyText(ready), { autoClose: 3000 });
      ready = [];
    }
  });
}

/** Warn once when a sandbox's workspace goes over its disk limit (local backend). */
function watchDisks(events: SandboxEvents): void {
  const over = new Set<string>(); // kernel ids warned about
  events.changed.connect((_, snapshot: ISnapshot) => {
    const now = new Set<string>();
    for (const kernel of snapshot.kernels) {
      if (!diskUse(kernel.sandbox)?.over) {
        continue;
      }
      now.add(kernel.id);
      if (!over.has(kernel.id)) {
        Notification.warning(
          `Sandbox ${kernel.sandbox.sandbox}: ` +
            (kernel.sandbox.message || 'the workspace is over its disk limit.'),
          { autoClose: false }
        );
      }
    }
    over.clear();
    now.forEach(id => over.add(id));
  });
}

async function setUpLauncher(
  app: JupyterFrontEnd,
  launcher: ILauncher,
  specs: () => KernelSpec.ISpecModels | null
): Promise<void> {
  const { commands, serviceManager } = app;
  await serviceManager.kernelspecs.ready;
  const icons = new Map<string, LabIcon>();
  const label = (args: ReadonlyPartialJSONObject) => {
    const name = String(args.kernelName ?? '');
    const display = specs()?.kernelspecs[name]?.display_name ?? name;
    return args.isLauncher ? display : `New Notebook: ${display}`;
  };
  commands.addCommand(CommandIDs.newNotebook, {
    label,
    caption: 'A notebook whose kernel runs in its own sandbox',
    icon: args => icons.get(String(args.kernelName)) ?? sandboxIcon,
    execute: args =>
      commands.execute('notebook:create-new', {
        kernelName: args.kernelName ?? null,
        cwd: args.cwd ?? ''
      })
  });
  commands.addCommand(CommandIDs.newConsole, {
    label: args => {
      const name = String(args.kernelName ?? '');
      const display = specs()?.kernelspecs[name]?.display_name ?? name;
      return args.isLauncher ? display : `New Console: ${display}`;
    },
    caption: 'A console whose kernel runs in its own sandbox',
    icon: args => icons.get(String(args.kernelName)) ?? sandboxIcon,
    execute: args =>
      commands.execute('console:create', {
        kernelPreference: { name: args.kernelName ?? null },
        basePath: args.cwd ?? '',
        cwd: args.cwd ?? ''
      })
  });

  // JupyterLab's own Notebook/Console sections list every kernelspec; the
  // sandboxed ones are shown in their own sections instead. The launcher model
  // has no removal API for items another plugin added, so filter on read.
  const model = launcher as ILauncher & { items?: () => IterableIterator<ILauncher.IItemOptions> };
  if (typeof model.items === 'function') {
    const original = model.items.bind(model);
    model.items = function* () {
      for (const item of original()) {
        const name = item.args?.kernelName ?? (item.args?.kernelPreference as any)?.name;
        const builtIn = item.command === 'notebook:create-new' || item.command === 'console:create';
        if (builtIn && isSandboxSpec(specs(), name)) {
          continue;
        }
        yield item;
      }
    };
  }

  let added: { dispose(): void }[] = [];
  const refresh = async () => {
    for (const d of added) {
      d.dispose();
    }
    added = [];
    const all = specs()?.kernelspecs ?? {};
    const names = Object.keys(all)
      .filter(name => isSandboxSpec(specs(), name))
      .sort((a, b) => (all[a]?.display_name ?? a).localeCompare(all[b]?.display_name ?? b));
    for (const name of names) {
      const spec = all[name];
      if (spec && !icons.has(name)) {
        icons.set(name, await kernelIcon(spec));
      }
    }
    names.forEach((name, rank) => {
      added.push(
        launcher.add({
          command: CommandIDs.newNotebook,
          args: { isLauncher: true, kernelName: name },
          category: LAUNCHER_NOTEBOOKS,
          categoryRank: -1, // before JupyterLab's Notebook section (0): sandboxed first
          rank
        }),
        launcher.add({
          command: CommandIDs.newConsole,
          args: { isLauncher: true, kernelName: name },
          category: LAUNCHER_CONSOLES,
          categoryRank: 19, // before its Console section (20)
          rank
        })
      );
    });
  };
  await refresh();
  serviceManager.kernelspecs.specsChanged.connect(() => void refresh());
}

export default plugin;
