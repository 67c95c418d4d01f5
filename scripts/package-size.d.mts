/** Types of scripts/package-size.mjs, for the package test. */

export interface PackageSizes {
  /** The tarball `npm pack` made. */
  tarballBytes: number;
  /** What installing the tarball alone put in node_modules. */
  installedBytes: number;
  /** The packages it brought besides idem. */
  dependencies: string[];
}

export function measure(tarball: string, project: string): PackageSizes;
export function sentence(sizes: PackageSizes): string;
export function readmeSizes(text?: string): { installedMb: number; tarballMb: number } | undefined;
