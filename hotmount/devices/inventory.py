"""The node's device inventory: the allow-list every request is checked against.

An agent that can be talked into granting `/dev/sda` is a root shell on the
node, so a request names a device from this inventory (index, UUID, MIG UUID or
CDI name) and nothing else: raw `major:minor`, device paths and block devices
are refused before anything is touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from hotmount.devices import cdi, mig, mig_nvml, nvidia, rdma, topology
from hotmount.devices.model import Device, DeviceKind, DeviceNode, MigDetails
from hotmount.devices.topology import PciLocation
from hotmount.errors import DeviceNotFound, InvalidDeviceRef
from hotmount.hostfs import HostRoot
from hotmount.state import claims

DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")

_INDEX = re.compile(r"^\d{1,3}$")
_MIG_ALIAS = re.compile(r"^\d{1,3}:\d{1,3}:\d{1,3}$")  # <gpu index>:<gi>:<ci>
_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9/_-]{1,120}$")
_CDI = re.compile(r"^[a-z0-9.-]+/[a-zA-Z0-9_.-]+=[a-zA-Z0-9_.:-]+$")
_RDMA = re.compile(r"^rdma/[A-Za-z0-9_.-]{1,64}$")  # rdma/mlx5_0, rdma/uverbs0
_RAW = re.compile(r"^([abc]\s+)?(\d+|\*):(\d+|\*)(\s+[rwm]+)?$")


def check_ref(ref: str) -> str:
    """Validate the *form* of a device reference; return it stripped."""
    ref = ref.strip()
    if _RAW.match(ref):
        raise InvalidDeviceRef(
            f"{ref!r} is a raw major:minor; name a device from the inventory "
            "(index, UUID or CDI name)"
        )
    if ref.startswith("/"):
        raise InvalidDeviceRef(f"{ref!r} is a path; name a device from the inventory")
    forms = (_INDEX, _MIG_ALIAS, _UUID, _CDI, _RDMA)
    if not any(form.match(ref) for form in forms):
        raise InvalidDeviceRef(
            f"{ref!r} is not a device name: use an index (0), a MIG index (0:1:0), "
            "a UUID (GPU-..., MIG-...), a CDI name (vendor/class=name) "
            "or an RDMA device (rdma/mlx5_0)"
        )
    return ref


@dataclass
class Inventory:
    devices: list[Device]
    refused: dict[str, str] = field(default_factory=dict)
    # Where each device sits on the PCIe tree (GPUs and RDMA NICs whose place is known).
    locations: dict[str, PciLocation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.devices = fold_aliases(self.devices)
        self._by_name: dict[str, Device] = {}
        self._by_cdi_name: dict[str, Device] = {}
        # A PCI function -> its device: GPUs and RDMA NICs come first in `devices`, so a
        # CDI device placed at the same function never shadows them.
        self._by_pci: dict[str, Device] = {}
        for device in self.devices:
            for name in (device.key, *device.aliases):
                self._by_name.setdefault(name, device)
                if _CDI.match(name):
                    self._by_cdi_name.setdefault(name.partition("=")[2], device)
            address = self._pci_address(device)
            if address is not None:
                self._by_pci.setdefault(address, device)
        self._ignore = claims.CONTROL_NUMBERS | {
            (n.major, n.minor)
            for d in self.devices
            for n in (*d.shared_nodes, *d.nodes)
            if n in d.shared_nodes or n.path == rdma.RDMA_CM_PATH
        }
        self._footprints = {d.key: claims.footprint(d, self._ignore) for d in self.devices}

    def _pci_address(self, device: Device) -> str | None:
        """The PCI function a device is (a MIG instance is only part of one: None)."""
        if device.kind is DeviceKind.MIG:
            return None
        location = self.locations.get(device.key)
        place = device.pci_bus_id or (location.bus_id if location else None)
        return topology.pci_address(place) if place else None

    @classmethod
    def load(
        cls,
        host: HostRoot,
        cdi_dirs: Iterable[str] = DEFAULT_CDI_DIRS,
        use_nvml: bool = True,
        sys_host: HostRoot | None = None,
    ) -> Inventory:
        """`sys_host`: where `/sys` is read for RDMA devices and PCIe places (default
        `host`; tests give a fixture sysfs beside the real /proc)."""
        sys_host = sys_host or host
        gpus = (nvidia.gpus_from_nvml() if use_nvml else None) or nvidia.gpus_from_procfs(host)
        devices: list[Device] = []
        if gpus:
            control = nvidia.control_nodes(host, nvidia.char_majors(host))
            by_minor = {gpu.minor: gpu for gpu in gpus}
            for gpu in gpus:
                devices.append(
                    Device(
                        key=gpu.uuid,
                        kind=DeviceKind.GPU,
                        nodes=(nvidia.gpu_node(gpu.minor),),
                        shared_nodes=control,
                        index=gpu.index,
                        uuid=gpu.uuid,
                        pci_bus_id=gpu.pci_bus_id,
                        minor=gpu.minor,
                        aliases=(str(gpu.index),),
                    )
                )
            devices += _mig_devices(host, by_minor, control)
        rdma_cm = rdma.rdma_cm_node(sys_host)
        nics = rdma.nics(sys_host)
        devices += [rdma.device(nic, rdma_cm) for nic in nics]
        found = cdi.load_specs(host, list(cdi_dirs))
        cdi_devices = [_with_rdma_cm(d, rdma_cm) for d in found.devices]
        every = devices + cdi_devices
        locations = _locations(sys_host, every, {rdma.RDMA_PREFIX + n.name: n for n in nics})
        return cls(every, found.refused, locations)

    def resolve(self, ref: str) -> Device:
        ref = check_ref(ref)
        if ref in self.refused:
            raise InvalidDeviceRef(f"device {ref} is refused: {self.refused[ref]}")
        device = self._by_name.get(ref)
        if device is None:
            raise DeviceNotFound(f"device {ref!r} is not in this node's inventory")
        return device

    def resolve_all(self, refs: Iterable[str]) -> list[Device]:
        """Resolve every reference before anything is done; duplicates collapse."""
        chosen: dict[str, Device] = {}
        for ref in refs:
            device = self.resolve(ref)
            chosen.setdefault(device.key, device)
        if not chosen:
            raise InvalidDeviceRef("no device named")
        return list(chosen.values())

    def location(self, device: Device) -> PciLocation | None:
        """A device's PCIe place; a MIG instance sits where its parent GPU does."""
        found = self.locations.get(device.key)
        if found is None and device.parent is not None:
            found = self.locations.get(device.parent)
        return found

    def rdma_devices(self) -> list[Device]:
        return [d for d in self.devices if rdma.is_rdma(d)]

    def nearest_rdma(self, device: Device) -> Device:
        """The RDMA device nearest `device` by devices/topology.py's rule, or a clear error."""
        candidates = {d.key: loc for d in self.rdma_devices() if (loc := self.location(d))}
        if not candidates:
            raise DeviceNotFound("withRdma: this node's inventory has no RDMA device")
        target = self.location(device)
        if target is None:
            raise InvalidDeviceRef(
                f"withRdma: the PCIe place of {device.key} is unknown, so no NIC is nearest; "
                "name the RDMA device instead (rdma/<name>)"
            )
        chosen = topology.nearest(target, candidates)
        assert chosen is not None
        return self._by_name[chosen]

    def nearest_gpus(self) -> dict[str, list[Device]]:
        """RDMA key -> the GPUs for which it is the nearest NIC (what withRdma picks)."""
        nics = {d.key: loc for d in self.rdma_devices() if (loc := self.location(d))}
        gpus = {
            d.key: loc
            for d in self.devices
            if d.kind is not DeviceKind.MIG
            and not rdma.is_rdma(d)
            and (loc := self.location(d)) is not None
        }
        picked = topology.nearest_of_each(gpus, nics)
        return {nic: [self._by_name[g] for g in keys] for nic, keys in picked.items()}

    def get(self, key: str) -> Device | None:
        return self._by_name.get(key)

    def footprint(self, device: Device) -> claims.Footprint:
        """The physical numbers `device` holds (see hotmount/state/claims.py)."""
        found = self._footprints.get(device.key)
        return found if found is not None else claims.footprint(device, self._ignore)

    def overlapping(self, footprint: claims.Footprint) -> list[Device]:
        """Every inventoried device that shares a physical device with `footprint`."""
        return [d for d in self.devices if self._footprints[d.key].overlaps(footprint)]

    def kubelet_device(self, device_id: str) -> Device | None:
        """The device behind an ID the kubelet reports, whatever its form: a UUID, a
        time-sliced replica `UUID::n`, a MIG UUID, an index (device-id-strategy=index),
        a CDI name, fully qualified or bare (`MIG-<uuid>` as nvidia-ctk names it), or a
        PCI address (see `pci_device`)."""
        base = device_id.partition("::")[0]
        return self._by_name.get(base) or self._by_cdi_name.get(base) or self.pci_device(base)

    def pci_device(self, device_id: str) -> Device | None:
        """The device at the PCI function `device_id` names, or None.

        The SR-IOV network device plugin (k8snetworkplumbingwg/sriov-network-device-plugin)
        advertises each device of a pool by its PCI address: a VF's (`0000:3b:00.2`), or
        a PF's where the pool's selectors pick PFs (`pfNames`, `rootDevices`, `isRdma`).
        An RDMA NIC's place is that function's, read from the host's sysfs when the
        inventory was loaded (`/sys/class/infiniband/<dev>/device`, never a container's
        path), so the ID maps to the verbs device of exactly that function.
        """
        address = topology.pci_address(device_id)
        return self._by_pci.get(address) if address is not None else None


def fold_aliases(devices: list[Device]) -> list[Device]:
    """CDI devices whose own nodes are exactly an earlier device's fold into it as aliases.

    nvidia-ctk writes `nvidia.com/gpu=0` and `=GPU-<uuid>` for the same /dev/nvidia0 as
    the GPU the driver lists: one physical device, one entry, many names. Only identical
    nodes fold (path, numbers, mode, permissions: what a name gives a container must not
    change); a name whose nodes differ stays its own entry, and still collides physically.
    """
    out: list[Device] = []
    by_nodes: dict[frozenset[DeviceNode], int] = {}
    for device in devices:
        nodes = frozenset(device.nodes)
        first = by_nodes.get(nodes)
        if first is not None and device.kind is DeviceKind.CDI and nodes:
            host = out[first]
            names = (*host.aliases, device.key, *device.aliases)
            out[first] = replace(
                host, aliases=tuple(dict.fromkeys(n for n in names if n != host.key))
            )
            continue
        by_nodes.setdefault(nodes, len(out))
        out.append(device)
    return out


def _with_rdma_cm(device: Device, rdma_cm: DeviceNode | None) -> Device:
    """rdma_cm goes with every RDMA device, also one a CDI spec declares without it."""
    if rdma_cm is None or not rdma.is_rdma(device):
        return device
    if any(n.path == rdma.RDMA_CM_PATH for n in device.all_nodes):
        return device
    return replace(device, shared_nodes=(*device.shared_nodes, rdma_cm))


def _locations(
    host: HostRoot, devices: list[Device], nics: dict[str, rdma.RdmaNic]
) -> dict[str, PciLocation]:
    """PCIe places: a GPU's from its bus id, an RDMA NIC's from its sysfs device, anything
    else (CDI devices) from `/sys/dev/char` of its first own node that has one."""
    out: dict[str, PciLocation] = {}
    for device in devices:
        found: PciLocation | None = None
        nic = nics.get(device.key)
        if nic is not None:
            found = nic.location
        elif device.pci_bus_id is not None and device.kind is DeviceKind.GPU:
            found = topology.locate(host, device.pci_bus_id)
        elif device.kind is DeviceKind.CDI:
            for node in device.nodes:
                if node.path == rdma.RDMA_CM_PATH:
                    continue
                found = topology.char_device_location(host, node.major, node.minor)
                if found is not None:
                    break
        if found is not None:
            out[device.key] = found
    return out


def _mig_devices(
    host: HostRoot, gpus_by_minor: dict[int, nvidia.GpuInfo], control: tuple[DeviceNode, ...]
) -> list[Device]:
    majors = nvidia.char_majors(host)
    caps_major = majors.get("nvidia-caps")
    if caps_major is None:
        return []
    devices = []
    for instance, listed in mig_nvml.join(mig.mig_instances(host), _nvml_migs(gpus_by_minor)):
        parent = gpus_by_minor.get(instance.gpu_minor)
        if parent is None:
            continue
        # The key stays the /proc form whether or not NVML loads, so that the ledger's
        # records name the same device across restarts; the MIG UUID is its `uuid`
        # and a name it answers to.
        key = f"MIG-{parent.uuid}/{instance.gi}/{instance.ci}"
        uuid = listed.uuid if listed else None
        caps = "/dev/nvidia-caps/nvidia-cap"
        devices.append(
            Device(
                key=key,
                kind=DeviceKind.MIG,
                nodes=(
                    nvidia.gpu_node(parent.minor),
                    DeviceNode(f"{caps}{instance.gi_cap_minor}", caps_major, instance.gi_cap_minor),
                    DeviceNode(f"{caps}{instance.ci_cap_minor}", caps_major, instance.ci_cap_minor),
                ),
                shared_nodes=control,
                uuid=uuid,
                parent=parent.uuid,
                minor=parent.minor,
                aliases=(*([uuid] if uuid else []), f"{parent.index}:{instance.gi}:{instance.ci}"),
                mig=MigDetails(
                    instance.gi,
                    instance.ci,
                    source="nvml" if listed else "procfs",
                    profile=listed.profile if listed else None,
                    memory_mib=listed.memory_mib if listed else None,
                ),
            )
        )
    return devices


def _nvml_migs(gpus_by_minor: dict[int, nvidia.GpuInfo]) -> list[mig_nvml.NvmlMig] | None:
    """Every MIG device NVML listed, or None where NVML listed none of the GPUs' (no NVML)."""
    read = [gpu.migs for gpu in gpus_by_minor.values() if gpu.migs is not None]
    return [m for migs in read for m in migs] if read else None
